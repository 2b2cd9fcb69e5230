"""The asyncio side of one turn: an async iterator of its events, fed by the workers.

Events arrive in order (UserEncoded for a spoken turn, TextDelta / AudioChunk as generated,
one TurnDone): every worker delivers through `loop.call_soon_threadsafe`, and a turn's events
pass the workers one way (LM worker, then detokenizer worker), so their order is kept. A stage that
fails a turn says why in its TurnDone the same way on either worker (`failure_message`,
`client_fault`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from kimiaudio.engine.request import RequestError
from kimiaudio.errors import KimiAudioError
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


def client_fault(exc: Exception) -> str | None:
    """The TurnDone.error_code of a failure that was the request's fault, else None."""
    return exc.code if isinstance(exc, RequestError) else None


def failure_message(stage: str, exc: Exception) -> str:
    """What a client is told: a KimiAudioError says itself; anything else names its type."""
    if isinstance(exc, KimiAudioError):
        return f"{stage}: {exc}"
    return f"{stage} failed ({type(exc).__name__}: {exc})"
