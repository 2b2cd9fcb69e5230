"""The asyncio side of one turn: an async iterator of its events, fed by the workers.

Events arrive in order (UserEncoded for a spoken turn, TextDelta / AudioChunk as generated, one
TurnDone): every worker delivers through `loop.call_soon_threadsafe`, and a turn's events pass the
workers one way (LM worker, then detokenizer worker), so their order is kept.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from kimiaudio.pipeline.event_stream import EventStream
from kimiaudio.pipeline.events import PipelineEvent, TurnDone


class TurnHandle(EventStream[PipelineEvent]):
    """Async iterator of one turn's events; the last one is TurnDone."""

    def __init__(self, turn_id: str, loop: asyncio.AbstractEventLoop):
        super().__init__(loop, lambda event: isinstance(event, TurnDone))
        self.turn_id = turn_id
        self.submitted_at = time.perf_counter()
        self.background = False  # a background-priority turn: counted apart from the answers

    @property
    def done(self) -> TurnDone | None:
        """The TurnDone, once it reached the loop (None while the turn runs)."""
        return self.last if isinstance(self.last, TurnDone) else None

    async def result(self) -> TurnDone | None:
        """Read the turn's events to the end; its TurnDone (None if the stream ended without one)."""
        async for _ in self:
            pass
        return self.done

    def seconds(self) -> float:
        """Seconds since submit (the time base of TurnDone.timings)."""
        return time.perf_counter() - self.submitted_at


def deliver_done(handle: TurnHandle, done: TurnDone, metrics) -> None:
    """End the turn: its TurnDone, stamped with done_s, to the loop and to the metrics."""
    timings = dict(done.timings)
    timings.setdefault("done_s", handle.seconds())
    done = dataclasses.replace(done, timings=timings)
    metrics.note_turn(done.status, timings, handle.background)
    handle.deliver(done)
