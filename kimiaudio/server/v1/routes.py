"""The /v1 routes on the app (the package docstring lists them)."""

from __future__ import annotations

from aiohttp import web

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.v1.chat import chat_completions
from kimiaudio.server.v1.models import list_models
from kimiaudio.server.v1.realtime import realtime
from kimiaudio.server.v1.transcriptions import transcriptions


def setup_openai_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/realtime", realtime)
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_route("*", "/v1/{tail:.*}", not_found)


async def not_found(request: web.Request) -> web.Response:
    raise ApiError(
        404,
        "unknown_url",
        f"no route {request.method} {request.path} (see GET /v1/models and the README's HTTP API section)",
    )
