"""The server's live real-time clients: how many may come in, how one is let in and let go.

Admission: `server.max_sessions` slots shared by every transport (WebRTC offers and calls,
the Realtime WebSocket). `reserve()` checks the count and takes a slot in one synchronous step
on the event loop, so concurrent requests can never all pass the check first and overfill the
cap (the race of checking before a slow body is read and taking the slot after it). A route
reserves once the client's request is read and valid (a stalled body then holds no slot), may
`check()` earlier to refuse a full server at once, and the slot is freed on every path: a
failed setup or the transport's close. Once the server drains (graceful shutdown) no slot is
given (503, as middleware/draining.py answers other requests then).

Letting a client in (`opened`): a slot is reserved, a VAD is made on the VAD thread, the
transport is built (`make`) with what it was admitted with (`Admitted`: a new session id, the
VAD, and `release`, which its close calls), the caller sets it up (answers the offer...), and
only then is it registered under its id and counted in the metrics (kimiaudio_sessions_total,
by transport). A failure at any step closes what was built and frees the slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from kimiaudio.server.middleware.draining import server_full, shutting_down
from kimiaudio.server.observe.server_metrics import ServerMetrics

if TYPE_CHECKING:
    from kimiaudio.audio.vad import SileroVad


class Transport(Protocol):
    """What carries one real-time client's session (transport/: RtcPeer, RealtimeSocket)."""

    @property
    def id(self) -> str: ...  # the session id it was admitted with

    @property
    def closed(self) -> bool: ...  # True from the first close() on

    @property
    def is_answering(self) -> bool: ...  # a response is being generated or played

    async def close(self, reason: str = ..., shutdown: bool = ...) -> None:
        """Close the session (storing what was heard) and the connection; later calls wait for
        the first one; calls its Admitted.release."""


T = TypeVar("T", bound=Transport)


@dataclass(frozen=True)
class Admitted:
    """What a transport is built with when its client is let in."""

    session_id: str
    vad: SileroVad  # the session's own, used on the VAD thread only
    release: Callable[[], None]  # its close must call this: frees the slot, forgets the session


class SessionRegistry:
    def __init__(self, max_sessions: int, metrics: ServerMetrics, vad_executor: Executor):
        self.max_sessions = max_sessions
        self.num_reserved = 0
        self.is_draining = False
        self._metrics = metrics
        self._vad_executor = vad_executor
        self._live: dict[str, Transport] = {}  # session id -> the transport carrying it

    def __len__(self) -> int:
        return len(self._live)

    def live(self) -> list[Transport]:
        return list(self._live.values())

    # ----- admission -----
    def check(self) -> None:
        """ApiError 503 (full, or shutting down) with Retry-After if no slot is free now."""
        if self.is_draining:
            raise shutting_down()
        if self.num_reserved >= self.max_sessions:
            raise server_full(self.max_sessions)

    def reserve(self) -> Callable[[], None]:
        """Take a slot (or ApiError 503 as `check` says; no await between the check and the
        take) -> its release, which may be called any number of times."""
        self.check()
        self.num_reserved += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.num_reserved -= 1

        return release

    # ----- letting a client in -----
    @contextlib.asynccontextmanager
    async def opened(self, kind: str, make: Callable[[Admitted], Awaitable[T]]) -> AsyncIterator[T]:
        """Yields the transport `make` built; the body sets it up. `kind` labels it in the
        metrics ("webrtc", "websocket")."""
        from kimiaudio.audio.vad import SileroVad  # loads torch: only once a client comes

        free_slot = self.reserve()
        session_id = f"sess_{secrets.token_hex(8)}"

        def release() -> None:
            self._live.pop(session_id, None)
            free_slot()

        transport = None
        try:
            vad = await asyncio.get_running_loop().run_in_executor(self._vad_executor, SileroVad)
            transport = await make(Admitted(session_id, vad, release))
            yield transport
            if not transport.closed:  # it may have failed already, and freed its slot
                self._live[session_id] = transport
            self._metrics.sessions.labels(kind).inc()
        except BaseException:
            free_slot()
            if transport is not None:
                await transport.close("its setup failed")
            raise

    async def close_all(self) -> None:
        """Shutdown: no slot is given any more; every live session is closed (what was heard is stored)."""
        self.is_draining = True
        closing = (t.close("the server is shutting down", shutdown=True) for t in self.live())
        await asyncio.gather(*closing, return_exceptions=True)
        self._live.clear()
