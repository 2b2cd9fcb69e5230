"""An async iterator fed from another thread: the GPU worker's way to stream to the loop.

The worker calls `deliver(event)` (any thread); the event is put on the stream's asyncio
queue through `loop.call_soon_threadsafe`, so the loop never waits on the worker. The stream
ends after the event for which `is_last(event)` is true; later events are dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class EventStream(Generic[T]):
    def __init__(self, loop: asyncio.AbstractEventLoop, is_last: Callable[[T], bool]):
        self.loop = loop
        self._is_last = is_last
        self._queue: asyncio.Queue[T] = asyncio.Queue()
        self.last: T | None = None  # loop side: the final event, once it has been queued
        self._ended = False  # loop side: the consumer has taken the final event

    def deliver(self, event: T) -> bool:
        """From any thread; False if the stream's event loop is closed."""
        try:
            self.loop.call_soon_threadsafe(self._put, event)
            return True
        except RuntimeError:
            return False

    def _put(self, event: T) -> None:
        if self.last is not None:
            return
        if self._is_last(event):
            self.last = event
        self._queue.put_nowait(event)

    def __aiter__(self) -> EventStream[T]:
        return self

    async def __anext__(self) -> T:
        if self._ended:
            raise StopAsyncIteration
        event = await self._queue.get()
        self._ended = event is self.last  # _put judged it already
        return event
