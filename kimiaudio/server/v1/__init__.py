"""The OpenAI-compatible API under /v1, in the same app and process as the WebRTC server.

    GET  /v1/models                  the served model
    POST /v1/audio/transcriptions    speech to text (multipart upload)
    POST /v1/chat/completions        audio (and text) in, text and audio out, streaming or not
    GET  /v1/realtime                the Realtime protocol over a WebSocket
    POST /v1/realtime/calls          the Realtime protocol over WebRTC (SDP offer in, answer out);
         /v1/realtime/calls/{id}/hangup ends a call
    POST /v1/realtime/client_secrets an ephemeral key for a browser (with the API key only)
    POST /v1/realtime/sessions, /v1/realtime/transcription_sessions  the beta API's ways to one

Every turn runs through the server's one pipeline, so HTTP, WebSocket and WebRTC turns batch
together on the device. Errors are OpenAI-shaped (server/api_error.py).
"""
