"""A step's rows on the host: every scheduled position of a StepPlan, concatenated in batch order.

What both ways of running a step with prefill chunks read: the flat batch built for the step
(model_runner.py) and the static buffers padded to a token bucket (mixed_batch.py). Continuous
features enter only for the positions computed in this step, as slices of each sequence's
feature tensor (its continuous rows are consecutive); logits are wanted only for the last row
of each sequence that completes its pending positions. Rows at a position whose ids are still
on the device (a decode launched ahead of its previous step's read) say where to take them
(launched_step.row_ids).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kimiaudio.engine.launched_step import LaunchedStep, row_ids
from kimiaudio.engine.sequence import Sequence
from kimiaudio.engine.step_plan import StepPlan


@dataclass
class FlatStep:
    audio_ids: list[int] = field(default_factory=list)
    text_ids: list[int] = field(default_factory=list)
    use_text: list[bool] = field(default_factory=list)
    continuous: list[bool] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    features: list[torch.Tensor] = field(default_factory=list)  # rows of the continuous positions, in order
    entries: list[tuple[list[int], int, int]] = field(default_factory=list)  # (block table, start, count)
    # Per row, the previous launched step's row to take the sampled text / audio id from (-1: none).
    text_from: list[int] = field(default_factory=list)
    audio_from: list[int] = field(default_factory=list)
    logits_rows: list[int] = field(default_factory=list)  # the last row of each sampling sequence
    sampling: list[Sequence] = field(default_factory=list)  # those sequences, in batch order

    @classmethod
    def of(cls, plan: StepPlan, previous: LaunchedStep | None = None) -> FlatStep:
        """The plan's rows; at positions still unresolved, what `row_ids` says of them."""
        step = cls()
        for seq, count in plan:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + count
            settled = min(end, max(start, seq.num_tokens - seq.num_unresolved))
            unresolved = [row_ids(seq, p, previous) for p in range(settled, end)]
            step.audio_ids += seq.audio_ids[start:settled] + [r.audio for r in unresolved]
            step.text_ids += seq.text_ids[start:settled] + [r.text for r in unresolved]
            step.use_text += seq.use_text[start:settled] + [bool(r.use_text) for r in unresolved]
            step.text_from += [-1] * (settled - start) + [r.text_from for r in unresolved]
            step.audio_from += [-1] * (settled - start) + [r.audio_from for r in unresolved]
            step.continuous += seq.continuous_mask[start:end]
            step.positions += range(start, end)
            rows = [r for r in seq.feature_rows[start:end] if r >= 0]
            if rows and seq.features is not None:
                step.features.append(seq.features[rows[0] : rows[-1] + 1])
            step.entries.append((seq.block_table, start, count))
            if end == seq.num_tokens:
                step.logits_rows.append(len(step.audio_ids) - 1)
                step.sampling.append(seq)
        return step

    @property
    def num_tokens(self) -> int:
        return len(self.audio_ids)

    @property
    def takes_sampled(self) -> bool:
        """Whether some row takes an id from the previous launched step's samples."""
        return any(r >= 0 for r in self.text_from) or any(r >= 0 for r in self.audio_from)

    @property
    def feature_positions(self) -> list[int]:
        """The rows that take a feature row, in order."""
        return [i for i, c in enumerate(self.continuous) if c]
