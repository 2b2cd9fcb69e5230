"""TurnQueue: what a Realtime session has to take in order (queued_turn.py), taken one entry at a
time by the session's turn task (realtime_session.py).

Each entry remembers whether the server was stopping when it came (`stopping`, given by the
session): while such an entry is taken, `taking_late` is True, and no answer is started for it
(the answers asked for before the server began to stop may finish in its grace; a later one
would only be cut).

Stopping the queue (`stop`, as the session closes) ends the taking: the entry being taken ends,
and what is still queued is dropped. The session's close then waits for that entry (`idle`), so
that a user item being stored when the client hung up is stored whole, and so that nothing the
turn task does overlaps the session's tasks being stopped and its conversation released.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from kimiaudio.server.session.queued_turn import QueuedTurn

CLOSE_TIMEOUT_S = 5.0  # how long a close waits for the entry being taken (a store write, at most)


class TurnQueue:
    def __init__(self, stopping: Callable[[], bool] = lambda: False) -> None:
        self._stopping = stopping
        self._queue: asyncio.Queue[tuple[QueuedTurn, bool]] = asyncio.Queue()
        self.taking_late = False  # the entry being taken came once the server was stopping
        self._idle = asyncio.Event()  # no entry is being taken
        self._idle.set()
        self._closed = False
        self.taken_count = 0  # entries taken so far

    def put_nowait(self, work: QueuedTurn) -> None:
        self._queue.put_nowait((work, self._stopping()))

    async def taken(self) -> AsyncIterator[QueuedTurn]:
        """Each entry in order, the next once the last one's taker asks for it; none once closed."""
        while True:
            self._idle.set()
            work, self.taking_late = await self._queue.get()
            if self._closed:
                return
            self._idle.clear()
            self.taken_count += 1
            yield work

    @property
    def busy(self) -> bool:
        """An entry is being taken, or waits."""
        return not self._idle.is_set() or not self._queue.empty()

    def stop(self) -> None:
        """Take nothing more from now on."""
        self._closed = True

    async def idle(self) -> None:
        """Return once the entry being taken has ended (or after CLOSE_TIMEOUT_S)."""
        try:
            await asyncio.wait_for(self._idle.wait(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            pass  # the session's tasks are stopped next, its turn task with them
