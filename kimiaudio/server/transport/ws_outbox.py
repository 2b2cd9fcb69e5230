"""WsOutbox: a session's events to one WebSocket, in order, through one writer task.

The session sends from the event loop without waiting (`send`); the writer sends what is
queued. A client that reads too slowly to keep MAX_OUTBOX_BYTES of events in flight, or
whose connection fails, is `dropped`: nothing more is queued, and the WebSocket is closed at once
(which ends its owner's reader).
`finish` sends what is still queued (a session's last events: response.done) for at most a
moment, then stops the writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from aiohttp import WSCloseCode, web

log = logging.getLogger(__name__)

# Events waiting for a slow client before it is dropped, counted in bytes: a few retrieved items
# of minutes of audio weigh as much as thousands of audio deltas. (About 8 minutes of GA audio
# deltas; one event larger than this goes out alone.)
MAX_OUTBOX_BYTES = 32 * 1024 * 1024
FINISH_S = 2.0  # how long the last events may take to go out


class WsOutbox:
    def __init__(
        self,
        ws: web.WebSocketResponse,
        transport: asyncio.Transport | None,
        label: str,
    ):
        """transport: the connection's (its request's), cut when the client is dropped; label: who
        it sends to, for the log."""
        self._ws = ws
        self._transport = transport
        self._label = label
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._queued_bytes = 0  # of the events in _queue (JSON is ASCII: a character is a byte)
        self._writer: asyncio.Task | None = None
        self.dropped = False  # the client is gone or too slow: nothing more is sent
        self._aborted = False  # its connection was cut: there is nothing left to close
        self._going_away = False  # closing because the server stops

    def start(self) -> None:
        self._writer = asyncio.get_running_loop().create_task(self._write())

    def send(self, event: dict) -> None:
        if self.dropped:
            return
        text = json.dumps(event)
        if self._queued_bytes and self._queued_bytes + len(text) > MAX_OUTBOX_BYTES:
            log.info("%s: the client reads too slowly, closing", self._label)
            self.dropped = True
            # A client that reads nothing blocks every write, the close frame's too, and a close
            # would wait for what is buffered: the connection is cut, buffer and all, which ends
            # the writer and the owner's reader at once.
            self._aborted = True
            if self._transport is not None:
                self._transport.abort()
            if self._writer is not None:
                self._writer.cancel()
            return
        self._queued_bytes += len(text)
        self._queue.put_nowait(text)

    async def finish(self, going_away: bool = False) -> None:
        """Send what is queued, then close the WebSocket (`going_away`: the server stops, 1001)."""
        if self._aborted:
            return
        self._going_away = going_away
        self._queue.put_nowait(None)
        if self._writer is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._writer), FINISH_S)
            except TimeoutError:
                self._writer.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._close_ws(), FINISH_S)

    async def _close_ws(self) -> None:
        if self._going_away:
            await self._ws.close(code=WSCloseCode.GOING_AWAY, message=b"the server is shutting down")
        else:
            await self._ws.close()

    async def _write(self) -> None:
        try:
            while (text := await self._queue.get()) is not None:
                self._queued_bytes -= len(text)
                await self._ws.send_str(text)
        except (ConnectionError, RuntimeError) as exc:  # the client went away
            log.debug("%s: sending failed: %s", self._label, exc)
        finally:
            self.dropped = True
            if not self._aborted:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._close_ws(), FINISH_S)  # ends the reader loop too
