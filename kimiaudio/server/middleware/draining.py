"""While the server drains (graceful shutdown), new work is refused: 503 with Retry-After.

`draining_middleware(is_draining)` answers every new request 503 once `is_draining()` is true,
but the probes and the metrics (which say the server is going away). The session registry
(session_registry.py) refuses new real-time sessions with the same error, and a full server
with `server_full`.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from kimiaudio.server.api_error import ApiError

RETRY_AFTER_S = 10
_ANSWERED_WHILE_DRAINING = ("/healthz", "/readyz", "/metrics")


def shutting_down() -> ApiError:
    return ApiError(
        503,
        "shutting_down",
        "the server is shutting down; try again in a few seconds",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def server_full(max_sessions: int) -> ApiError:
    return ApiError(
        503,
        "server_full",
        f"the server is full ({max_sessions} sessions); try again in a few seconds",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def draining_middleware(is_draining: Callable[[], bool]) -> Middleware:
    """The middleware that refuses new work once `is_draining()` (shutdown)."""

    @web.middleware
    async def refuse_while_draining(request: web.Request, handler: Handler) -> web.StreamResponse:
        if is_draining() and request.path not in _ANSWERED_WHILE_DRAINING:
            raise shutting_down()
        return await handler(request)

    return refuse_while_draining
