"""Which sessions' detokenizer chunks run next (no torch): priority is latency.

Sessions are judged by their playback deadline: the time at which the audio already sent to
the listener runs out (before the first audio, the time the turn was submitted: it is waiting
already). Duck-typed: anything with a `playback_deadline` (perf_counter seconds) will do.
"""

from __future__ import annotations

from typing import Protocol, Sequence, TypeVar


class HasDeadline(Protocol):
    @property
    def playback_deadline(self) -> float: ...


T = TypeVar("T", bound=HasDeadline)


def chunks_to_run(due: Sequence[T], now: float, llm_busy: bool, run_ahead_s: float,
                  limit: int) -> list[T]:
    """Which of the turns with a detokenizer chunk due run now (ARCHITECTURE: priority is
    latency): while the LLM has work, only those with less than `run_ahead_s` of audio left to
    play (a turn still waiting for its first audio always qualifies: its deadline has passed),
    and at most `limit`, soonest to run dry first. A turn left out keeps its deadline while the
    served ones move theirs later, so it comes first next time: nobody starves."""
    if llm_busy:
        due = [s for s in due if s.playback_deadline <= now + run_ahead_s]
    return sorted(due, key=lambda s: s.playback_deadline)[:limit]
