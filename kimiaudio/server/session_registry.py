"""The server's live real-time clients (app[sessions_key]): how one is let in and let go.

Both transports, the WebRTC offer (routes.py) and the Realtime WebSocket (v1/realtime.py),
open their client here, in the same steps: an admission slot is reserved (503 when the server
is full or shutting down), a VAD is made on the VAD thread, the transport is built with a new
session id, the caller sets it up (answers the offer...), and only then is it registered
under its id and counted in the metrics (kimiaudio_sessions_total, by transport). A failure
at any step closes what was built and frees the slot; the transport's close (closes_once.py)
unregisters it and frees its slot, whenever it comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from aiohttp import web

from kimiaudio.server.app_keys import admission_key, server_metrics_key, sessions_key, vad_executor_key

Transport = TypeVar("Transport")
# (session id, the VAD, the callback its close must call) -> the transport, not started
MakeTransport = Callable[[str, object, Callable[[object], None]], Awaitable[Transport]]


@contextlib.asynccontextmanager
async def opened_session(app: web.Application, kind: str, make: MakeTransport) -> AsyncIterator[Transport]:
    """Yields the transport `make` built; the body sets it up. `kind` labels it in the metrics
    ("webrtc", "websocket")."""
    from kimiaudio.audio.vad import SileroVad  # loads torch: only once a client comes

    sessions = app[sessions_key]
    slot = app[admission_key].reserve()

    def closed(transport) -> None:
        sessions.pop(transport.id, None)
        slot.release()

    transport = None
    try:
        vad = await asyncio.get_running_loop().run_in_executor(app[vad_executor_key], SileroVad)
        transport = await make(f"sess_{secrets.token_hex(8)}", vad, closed)
        yield transport
        if not transport.closed:  # it may have failed already, and freed its slot
            sessions[transport.id] = transport
        app[server_metrics_key].sessions.labels(kind).inc()
    except BaseException:
        slot.release()
        if transport is not None:
            await transport.close("its setup failed")
        raise
