"""The OpenAI-compatible API under /v1, in the same app and process as the WebRTC server.

    GET  /v1/models                  the served model
    POST /v1/audio/transcriptions    speech to text (multipart upload)
    POST /v1/chat/completions        audio (and text) in, text and audio out, streaming or not
    GET  /v1/realtime                the Realtime protocol over a WebSocket

Every turn runs through the server's one pipeline, so HTTP, WebSocket and WebRTC turns batch
together on the device. Errors are OpenAI-shaped (errors.py).
"""

from __future__ import annotations

from aiohttp import web


def setup_openai_routes(app: web.Application) -> None:
    from kimiaudio.server.v1.chat import chat_completions
    from kimiaudio.server.v1.errors import not_found
    from kimiaudio.server.v1.models import list_models
    from kimiaudio.server.v1.realtime import realtime
    from kimiaudio.server.v1.transcriptions import transcriptions

    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/realtime", realtime)
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_route("*", "/v1/{tail:.*}", not_found)
