"""What one engine step computes: the scheduler's decision, consumed by the runner (no torch).

Follows vLLM v1's SchedulerOutput: `Scheduler.schedule()` builds a plan from its locals and
returns it; the model runner turns it into tensors, `Scheduler.postprocess(plan)` accounts for
it. Nothing of a step's decision is left behind on the scheduler or on the sequences.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from kimiaudio.engine.sequence import Sequence


@dataclass
class StepPlan:
    """The sequences of one step in batch order, every decode first (one position each, so
    the decode rows of a flat batch are a leading slice), then the prefill chunks."""

    seqs: list[Sequence] = field(default_factory=list)
    num_scheduled: list[int] = field(default_factory=list)  # positions each computes, same order
    num_decodes: int = 0  # the leading decode rows
    num_tokens: int = 0  # positions in all
    num_prefill_tokens: int = 0  # prompt (or recomputed) positions: all but the decodes'
    num_preempted: int = 0  # sequences preempted while this step was planned

    def __bool__(self) -> bool:
        return bool(self.seqs)

    def __len__(self) -> int:
        return len(self.seqs)

    def __iter__(self) -> Iterator[tuple[Sequence, int]]:
        """(sequence, positions it computes) in batch order."""
        return iter(zip(self.seqs, self.num_scheduled))

    @property
    def is_all_single(self) -> bool:
        """Every sequence computes one position (decodes, or one-position prefill chunks)."""
        return all(n == 1 for n in self.num_scheduled)

    def without(self, dropped: list[Sequence]) -> StepPlan:
        """The same plan but for `dropped` (sequences that ended before it ran)."""
        if not dropped:
            return self
        plan = StepPlan(num_preempted=self.num_preempted)
        for i, (seq, count) in enumerate(self):
            if seq in dropped:
                continue
            if i < self.num_decodes:
                plan.add_decode(seq)
            else:
                plan.add_chunk(seq, count)
        return plan

    def add_decode(self, seq: Sequence) -> None:
        self.seqs.insert(self.num_decodes, seq)
        self.num_scheduled.insert(self.num_decodes, 1)
        self.num_decodes += 1
        self.num_tokens += 1

    def add_chunk(self, seq: Sequence, num_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_scheduled.append(num_tokens)
        self.num_tokens += num_tokens
        self.num_prefill_tokens += num_tokens
