"""The OpenAI-compatible API under /v1, in the same app and process as the WebRTC server.

    GET  /v1/models                  the served model
    POST /v1/audio/transcriptions    speech to text (multipart upload)
    POST /v1/chat/completions        audio (and text) in, text and audio out, streaming or not
    GET  /v1/realtime                the Realtime protocol over a WebSocket

Every turn runs through the server's one pipeline, so HTTP, WebSocket and WebRTC turns batch
together on the device. Errors are OpenAI-shaped (server/api_error.py).
"""
