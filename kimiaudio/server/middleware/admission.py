"""Admission of real-time sessions: a fixed number of slots, each checked and taken in one step.

`reserve()` checks the count and takes a slot in one synchronous step on the event loop, so
concurrent requests can never all pass the check first and overfill the cap (the race of
checking before a slow body is read and taking the slot after it). A transport reserves once
the client's request is read and valid (a stalled body then holds no slot), may `check()`
earlier to refuse a full server at once, and releases the slot on every path: a failed setup
or the session's close. Once the server is draining (graceful shutdown) no slot is given.
Every transport (WebRTC offers, the Realtime WebSocket) takes its slots here, so
`server.max_sessions` caps them together.

While draining, `draining_middleware` answers every new request 503, but the probes and the
metrics (which say the server is going away).
"""

from __future__ import annotations

from aiohttp import web

from kimiaudio.server.api_error import ApiError

RETRY_AFTER_S = 10
_ANSWERED_WHILE_DRAINING = ("/healthz", "/readyz", "/metrics")


class Slot:
    """One reserved session slot; `release()` may be called any number of times."""

    def __init__(self, admission: Admission):
        self._admission = admission
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._admission.num_reserved -= 1


class Admission:
    def __init__(self, max_sessions: int):
        self.max_sessions = max_sessions
        self.num_reserved = 0
        self.is_draining = False

    def check(self) -> None:
        """ApiError 503 (full, or shutting down) with Retry-After if no slot is free now."""
        if self.is_draining:
            raise _shutting_down()
        if self.num_reserved >= self.max_sessions:
            raise ApiError(
                503,
                "server_full",
                f"the server is full ({self.max_sessions} sessions); try again in a few seconds",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )

    def reserve(self) -> Slot:
        """A slot, or ApiError 503 as `check` says; no await between the check and the take."""
        self.check()
        self.num_reserved += 1
        return Slot(self)


def _shutting_down() -> ApiError:
    return ApiError(
        503,
        "shutting_down",
        "the server is shutting down; try again in a few seconds",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def draining_middleware(admission: Admission):
    """The middleware that refuses new work once `admission` is draining (shutdown)."""

    @web.middleware
    async def refuse_while_draining(request: web.Request, handler):
        if admission.is_draining and request.path not in _ANSWERED_WHILE_DRAINING:
            raise _shutting_down()
        return await handler(request)

    return refuse_while_draining
