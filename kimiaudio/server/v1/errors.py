"""Errors of the OpenAI-compatible routes, shaped as OpenAI's: {"error": {"message", "type",
"param", "code"}} with a 4xx status (5xx only for our own failures, never with a traceback).

Handlers raise V1Error; `openai_route` turns it, a KimiAudioError (bad input found deeper,
e.g. undecodable audio: 400), an aiohttp HTTPException (e.g. 413 from the body limit) and
anything unforeseen (logged, 500 without details) into that JSON. The app's own errors
(gate/api_error.py: access, admission, body limits) have the same shape and pass through; the
two could be one mechanism (V1Error adds `param` and the error `type`), not yet done.
"""

from __future__ import annotations

import functools
import logging

from aiohttp import web

from kimiaudio.errors import KimiAudioError
from kimiaudio.server.gate.api_error import ApiError

log = logging.getLogger(__name__)


class V1Error(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = status, message, code, param, kind


def error_body(message: str, code: str | None, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(exc: V1Error, headers: dict | None = None) -> web.Response:
    return web.json_response(error_body(exc.message, exc.code, exc.param, exc.kind), status=exc.status,
                             headers=headers)


def openai_route(handler):
    """Wrap a /v1 handler so that every failure is an OpenAI-shaped JSON error."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except V1Error as exc:
            return error_response(exc)
        except ApiError:  # the app's own (admission, access): already OpenAI-shaped
            raise
        except KimiAudioError as exc:
            return error_response(V1Error(400, str(exc), getattr(exc, "code", None) or "invalid_value"))
        except web.HTTPRequestEntityTooLarge as exc:
            return error_response(V1Error(413, f"the request body is too large ({exc.text})", "too_large"))
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_response(V1Error(exc.status, exc.reason, exc.reason.lower().replace(" ", "_")),
                                  headers={k: v for k, v in exc.headers.items() if k in ("Retry-After", "Allow")})
        except Exception:
            log.exception("unexpected error in %s %s", request.method, request.path)
            return error_response(V1Error(500, "internal server error (the details are in the server log)",
                                          "internal_error", kind="server_error"))

    return wrapped


async def not_found(request: web.Request) -> web.Response:
    return error_response(V1Error(404, f"no route {request.method} {request.path} (see GET /v1/models and the "
                                  "README's HTTP API section)", "unknown_url"))
