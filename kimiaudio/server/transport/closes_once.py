"""Closing a transport once, whoever asks first, and every asker waiting for that one close.

A client's hang-up, a failed write and the app's shutdown may each close the same transport,
at the same time. The first `close()` starts the transport's `_close` (one task); every later
call waits for it to finish: the app's shutdown must not go on (and stop the VAD thread and
the store) while a close begun by the client's hang-up is still storing what was heard.
"""

from __future__ import annotations

import asyncio


class ClosesOnce:
    """Base of a transport: subclasses implement `_close(reason, shutdown)`; `closed` is True from
    the first `close()` on. `reason`: for the log; `shutdown`: the server stops (the client is
    told so, and a WebSocket closes as going away)."""

    closed = False
    _closing: asyncio.Future | None = None

    async def close(self, reason: str = "closed by the server", shutdown: bool = False) -> None:
        if self._closing is None:
            self.closed = True
            self._closing = asyncio.ensure_future(self._close(reason, shutdown))
        await asyncio.shield(self._closing)

    async def _close(self, reason: str, shutdown: bool) -> None:
        raise NotImplementedError
