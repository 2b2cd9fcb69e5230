"""The real-time server: one aiohttp app, one typed context, one session behind two transports.

Layers, lowest first (tests/test_layering.py holds every import inside server/ to this order:
a module imports only from layers below its own, or from its own sub-package):

    api_error, tls, token_logprobs → inputs → observe → middleware → session_registry → context → session
        → transport → stored_voices, ephemeral_keys → routes, v1 → app → serve

- api_error.py: the one error type and error object every surface sends; tls.py: HTTPS;
  token_logprobs.py: token log-probabilities in OpenAI's shapes, for every surface.
- inputs/: what clients send, checked where it enters (JSON, multipart forms, SDP offers,
  audio, OpenAI's request fields and model names).
- observe/: metrics (Prometheus), the request and turn log lines, logging setup.
- middleware/: cross-origin answers (CORS), errors as JSON, access (Host, API key, Origin),
  draining, body limits.
- session_registry.py: admission (session slots) and the live sessions; the Transport protocol.
- context.py: ServerContext, everything a handler or a session is built from, one per app.
- session/: one client's conversation (RealtimeSession), whatever carries it: its events in
  and out, settings, turns, responses (Responder), what is stored; the Playback protocol.
- transport/: what carries a session: WebRTC (RtcPeer, its audio tracks), the Realtime
  WebSocket (RealtimeSocket, WsPlayback), and a sideband WebSocket on a call (Sideband).
- stored_voices.py: the stored voices in the pipeline, kept in step between instances.
- ephemeral_keys.py: minting ephemeral Realtime keys (OpenAI's client secrets) with the
  session configuration bound to them, and reading that configuration back when one is used.
- routes/: the app's routes outside /v1, grouped by what they serve; v1/: the OpenAI API,
  a sub-application mounted at /v1.
- app.py: the app factory (every cleanup context); serve.py: `python -m kimiaudio serve`.
"""
