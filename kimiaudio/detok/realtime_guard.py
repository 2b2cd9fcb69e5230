"""Which streams' detokenizer chunks run next, and with how many ODE steps (no torch).

Priority is latency. Streams are judged by their playback deadline: the time at which the
audio already sent to the listener runs out (before the first audio, the time the turn was
submitted: it is waiting already). A turn's first chunk goes ahead of any later chunk or
flush of the sessions already playing, and a batch holding first chunks takes only the
playing sessions that would run dry before the batch after it lands: the others have slack
and wait, so the first audio is not held back by a batch sized for everyone
(`chunks_to_run`). `plan_chunks` adds the real-time guard: when the GPU cannot keep a stream
ahead of its playback, the later chunks of its batch run with fewer ODE steps (down to a
floor) rather than letting it run dry. Duck-typed: streams need `playback_deadline`
(perf_counter seconds), `is_playing` (its first audio went out, so its next chunk is a later
one) and `next_chunk_s` (seconds of audio its next chunk adds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class GuardCandidate(Protocol):
    @property
    def playback_deadline(self) -> float: ...

    @property
    def is_playing(self) -> bool: ...

    @property
    def next_chunk_s(self) -> float: ...


C = TypeVar("C", bound=GuardCandidate)


def chunks_to_run(
    due: Sequence[C], now: float, llm_busy: bool, run_ahead_s: float, limit: int, horizon_s: float = 0.0
) -> list[C]:
    """Which of the turns with a detokenizer chunk due run now, at most `limit` (priority is
    latency: docs/architecture.md, "Threads and CUDA streams").

    Turns waiting for their first audio come first, longest waiting first. While any does, a
    playing turn joins the batch only if its audio runs out within `horizon_s` (the time this
    batch and the next take): the others have audio to spare and wait, so the batch stays as
    small as the first audio allows. Otherwise every playing turn may run, soonest to run dry
    first, except, while the LLM has work, those with more than `run_ahead_s` left to play.
    A turn left out keeps its deadline while the served ones move theirs later, so it comes
    first next time: nobody starves."""
    first = sorted((s for s in due if not s.is_playing), key=lambda s: s.playback_deadline)
    playing = [s for s in due if s.is_playing]
    if first:
        playing = [s for s in playing if s.playback_deadline <= now + horizon_s]
    elif llm_busy:
        playing = [s for s in playing if s.playback_deadline <= now + run_ahead_s]
    return (first + sorted(playing, key=lambda s: s.playback_deadline))[:limit]


@dataclass(frozen=True)
class GuardSettings:
    max_batch_sessions: int
    run_ahead_s: float
    first_ode_steps: int  # a first chunk's steps (lowered only if lower_first_chunk)
    ode_steps: int  # a later chunk's steps
    min_ode_steps: int  # the floor of a lowered chunk
    lower_first_chunk: bool


class CostEstimate:
    """Seconds per DiT call of recent batches (moving average), for the guard's forecast of a
    batch's time: a batch makes `steps` calls per group of equal step counts (steps - 1 Euler
    calls and one cache refresh); the vocoder and the rest are folded into the per-call time."""

    def __init__(self, seconds_per_call: float = 0.0, weight: float = 0.2):
        self.seconds_per_call, self.weight = seconds_per_call, weight

    def observe(self, seconds: float, calls: int) -> None:
        if calls > 0:
            sample = seconds / calls
            old = self.seconds_per_call
            self.seconds_per_call = sample if old == 0.0 else old + self.weight * (sample - old)

    def batch_seconds(self, steps_per_group: Sequence[int]) -> float:
        return self.seconds_per_call * sum(steps_per_group)


@dataclass(frozen=True)
class ChunkPlan(Generic[C]):
    streams: list[C]  # to run now, most urgent first
    ode_steps: list[int | None]  # per stream: None = its schedule's steps, else the guard's
    num_lowered: int  # chunks the guard gave fewer steps than their schedule


def plan_chunks(
    due: Sequence[C], now: float, llm_busy: bool, settings: GuardSettings, cost: CostEstimate
) -> ChunkPlan[C]:
    """The streams to run now (chunks_to_run; its horizon: a batch of first and later chunks
    at their normal steps, and one of later chunks after it) and their ODE steps.

    A playing stream is at risk when its audio would run dry before the chunk after this one
    can land: deadline + next_chunk_s < now + 2 x (this batch's forecast time at normal steps).
    If one is, the batch's later chunks all run with the most steps (>= min_ode_steps) for
    which that holds for the tightest of them (min_ode_steps if none does): chunks with equal
    step counts share the DiT calls, so lowering only the at-risk ones would add a group and
    make the batch slower; the others in the batch are the next most urgent anyway. First
    chunks keep first_ode_steps unless lower_first_chunk."""
    horizon = cost.batch_seconds([settings.first_ode_steps, settings.ode_steps]) + cost.batch_seconds(
        [settings.ode_steps]
    )
    streams = chunks_to_run(due, now, llm_busy, settings.run_ahead_s, settings.max_batch_sessions, horizon)
    first = [not s.is_playing for s in streams]
    normal = [settings.first_ode_steps if f else settings.ode_steps for f in first]
    lowerable = [not f or settings.lower_first_chunk for f in first]

    def with_steps(low: int) -> list[int]:
        return [min(low, n) if can else n for n, can in zip(normal, lowerable)]

    def forecast(steps: list[int]) -> float:  # one group of DiT calls per distinct step count
        return cost.batch_seconds(sorted(set(steps)))

    rooms = [s.playback_deadline + s.next_chunk_s - now for s, f in zip(streams, first) if not f]
    busy = 2 * forecast(normal)
    if settings.min_ode_steps >= settings.ode_steps or not any(room < busy for room in rooms):
        return ChunkPlan(streams, [None] * len(streams), 0)
    low = settings.min_ode_steps
    for steps in range(settings.ode_steps - 1, settings.min_ode_steps - 1, -1):
        if 2 * forecast(with_steps(steps)) <= min(rooms):
            low = steps
            break
    lowered = [c if c < n else None for c, n in zip(with_steps(low), normal)]
    return ChunkPlan(streams, lowered, sum(x is not None for x in lowered))
