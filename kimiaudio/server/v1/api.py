"""The /v1 sub-application: OpenAI's API, its routes and its own middleware.

Mounted under /v1 by app.py, so every request passes the app's middlewares first (errors,
access, draining, body limits), then this sub-application's: one log line per request
(observe/request_log.py), and errors mapped to the ApiError the client gets innermost
(middleware/error_responses.py), so that the log line says what the client was answered. A path
under /v1 that names no route is OpenAI's 404 `unknown_url`. The routes are listed in the
package docstring; GET /v1/models and /v1/models/{model} are here.
"""

from __future__ import annotations

import time

from aiohttp import web

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import server_context
from kimiaudio.server.inputs.openai_params import MODEL_ID, check_model
from kimiaudio.server.middleware.error_responses import errors_as_api_errors
from kimiaudio.server.observe.request_log import request_log_middleware
from kimiaudio.server.v1.chat import chat_completions
from kimiaudio.server.v1.client_secrets import beta_sessions, beta_transcription_sessions, client_secrets
from kimiaudio.server.v1.realtime import realtime
from kimiaudio.server.v1.realtime_calls import create_beta_call, create_call, hangup, sip_only
from kimiaudio.server.v1.transcriptions import transcriptions

_CREATED = int(time.time())


def create_v1_app(client_max_size: int) -> web.Application:
    """The sub-application to mount at /v1 (client_max_size: server.max_body_bytes, as the app's)."""
    app = web.Application(client_max_size=client_max_size, middlewares=[request_log_middleware, errors_as_api_errors])
    app.router.add_get("/models", list_models)
    app.router.add_get("/models/{model:.+}", retrieve_model)
    app.router.add_get("/realtime", realtime)
    app.router.add_post("/realtime", create_beta_call)
    app.router.add_post("/realtime/calls", create_call)
    app.router.add_post("/realtime/calls/{call_id}/hangup", hangup)
    app.router.add_post("/realtime/calls/{call_id}/{action:accept|reject|refer}", sip_only)
    app.router.add_post("/realtime/client_secrets", client_secrets)
    app.router.add_post("/realtime/sessions", beta_sessions)
    app.router.add_post("/realtime/transcription_sessions", beta_transcription_sessions)
    app.router.add_post("/audio/transcriptions", transcriptions)
    app.router.add_post("/chat/completions", chat_completions)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app


def _model(name: str) -> dict:
    return {"id": name, "object": "model", "created": _CREATED, "owned_by": "moonshotai"}


async def list_models(request: web.Request) -> web.Response:
    """The served model, under its id and each of [server] model_aliases."""
    names = [MODEL_ID, *dict.fromkeys(server_context(request).config.server.model_aliases)]
    return web.json_response({"object": "list", "data": [_model(name) for name in names]})


async def retrieve_model(request: web.Request) -> web.Response:
    """One name GET /v1/models lists (as it lists it), or 404 model_not_found."""
    name, aliases = request.match_info["model"], server_context(request).config.server.model_aliases
    check_model(name, aliases)
    return web.json_response(_model(name if name in aliases else MODEL_ID))


async def not_found(request: web.Request) -> web.Response:
    raise ApiError(
        404,
        "unknown_url",
        f"no route {request.method} {request.path} (see GET /v1/models and the README's HTTP API section)",
    )
