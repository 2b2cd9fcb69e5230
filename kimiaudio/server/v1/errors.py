"""Errors of the OpenAI-compatible routes: the app's ApiError (middleware/api_error.py), which has
OpenAI's shape {"error": {"message", "type", "param", "code"}}, built in the order of that
object. The app's error middleware answers for every /v1 failure as for any other route: a
KimiAudioError (bad input found deeper, e.g. undecodable audio) is a 400, an aiohttp
HTTPException (e.g. 413 from the body limit) keeps its status, anything unforeseen is logged
and a 500 without details.
"""

from __future__ import annotations

from aiohttp import web

from kimiaudio.server.middleware.api_error import ApiError


class V1Error(ApiError):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 kind: str | None = None):
        super().__init__(status, code, message, param=param, kind=kind)


async def not_found(request: web.Request) -> web.Response:
    raise V1Error(404, f"no route {request.method} {request.path} (see GET /v1/models and the "
                  "README's HTTP API section)", "unknown_url")
