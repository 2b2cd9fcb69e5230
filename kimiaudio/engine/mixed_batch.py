"""Static input buffers of mixed steps (prefill chunks beside decodes), padded to token buckets.

As decode_batch.py does for the all-decode step: a mixed step's inputs are written in place
into tensors allocated once, so a CUDA graph captured over views of them replays any later step
whose tokens fit the same bucket (step_graphs.py, one graph per bucket). Per token, up to
T = the largest bucket: audio id, text id, use_text, continuous flag, position and slot
([NUM_FIELDS, T] long) and the feature row placed there ([T, adaptor_dim]; the model adds it
only where the continuous flag is set). Per sequence slot, S = max_num_seqs of them plus one
for the padding: block table ([S + 1, W] int32, W = ceil(max_model_len / block_size)), run
start ([S + 2] int32) and context length ([S + 1] int32): the prefill kernel's RunsMetadata,
which covers decode rows (runs of one) and prefill chunks alike. Per sampling sequence the
row its logits come from ([S] long).

A step of N tokens from B sequences is padded to the next bucket Tb >= N: slots B..S-1 are
empty runs (no row, no key); the padding rows N..Tb-1 are the run of slot S, which has no key:
they hold token 0 at position 0, write their K/V into the pool's scratch slot and come out of
attention as zeros. Logits rows come first for the sequences that sample, in batch order; the
rest point at row 0 and are never read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kimiaudio.audio.device_result import copy_in, to_device
from kimiaudio.engine.flat_step import FlatStep
from kimiaudio.engine.kv_pool import KVPool
from kimiaudio.engine.launched_step import LaunchedStep, take_sampled
from kimiaudio.engine.paged_attention import (
    AttentionMetadata,
    PagedAttention,
    RunsMetadata,
    run_lists,
    slot_mapping,
)
from kimiaudio.engine.sequence import Sequence
from kimiaudio.engine.step_plan import StepPlan

AUDIO, TEXT, USE_TEXT, CONTINUOUS, POSITION, SLOT, TEXT_FROM, AUDIO_FROM = range(8)
NUM_FIELDS = 8


def mixed_token_buckets(max_tokens: int) -> list[int]:
    """Padded token counts: 16, 32, 64, 128, then every 64, and max_tokens itself (a mixed step
    of N tokens pads at most 63 rows beyond 128, which its weight reads dwarf)."""
    steps = [16, 32, 64, 128] + list(range(192, max_tokens, 64))
    return [s for s in steps if s < max_tokens] + [max_tokens]


@dataclass
class MixedBatch:
    """Views of the static buffers for one bucket: what the mixed forward reads."""

    audio_ids: torch.Tensor  # [Tb] long
    text_ids: torch.Tensor  # [Tb] long
    use_text: torch.Tensor  # [Tb] long, 0 or 1
    continuous: torch.Tensor  # [Tb] long, 0 or 1
    features: torch.Tensor  # [Tb, adaptor_dim]
    positions: torch.Tensor  # [Tb] long
    logits_rows: torch.Tensor  # [S] long
    attention: PagedAttention


class MixedInputs:
    def __init__(
        self,
        pool: KVPool,
        max_seqs: int,
        buckets: list[int],
        max_model_len: int,
        feature_dim: int,
        dtype: torch.dtype,
        use_kernel: bool,
    ):
        """buckets: ascending token counts, one static shape (a CUDA graph) each."""
        self.pool = pool
        self.block_size = pool.block_size
        self.max_seqs = max_seqs
        self.buckets = list(buckets)
        self.max_tokens = self.buckets[-1]
        self.max_blocks = -(-max_model_len // self.block_size)  # W: the block tables' fixed width
        self.use_kernel = use_kernel
        device = pool.kv.device
        self.fields = torch.zeros(NUM_FIELDS, self.max_tokens, dtype=torch.long, device=device)
        self.fields[SLOT] = pool.scratch_slot
        self.features = torch.zeros(self.max_tokens, feature_dim, dtype=dtype, device=device)
        self.block_tables = torch.full(
            (max_seqs + 1, self.max_blocks), pool.scratch_block, dtype=torch.int32, device=device
        )
        self.query_starts = torch.zeros(max_seqs + 2, dtype=torch.int32, device=device)
        self.context_lens = torch.zeros(max_seqs + 1, dtype=torch.int32, device=device)
        self.logits_rows = torch.zeros(max_seqs, dtype=torch.long, device=device)

    def bucket(self, num_tokens: int) -> int:
        if not 0 < num_tokens <= self.max_tokens:
            raise ValueError(f"a mixed step of {num_tokens} tokens: expected 1..{self.max_tokens}")
        return next(b for b in self.buckets if b >= num_tokens)

    def fits(self, plan: StepPlan) -> bool:
        """True if the step fits the static buffers (else: the eager flat batch)."""
        return (
            0 < plan.num_tokens <= self.max_tokens
            and len(plan) <= self.max_seqs
            and all(len(seq.block_table) <= self.max_blocks for seq in plan.seqs)
        )

    def prepare(self, plan: StepPlan, previous: LaunchedStep | None = None) -> tuple[int, list[Sequence]]:
        """Write the step's rows, runs and logits rows (then padding) into the buffers, on the
        current stream; rows at a position still unresolved take their ids from `previous`'s
        samples on the device. -> (the bucket, the sequences that sample: logits row k is the
        k-th's); `batch(bucket)` gives the views."""
        step = FlatStep.of(plan, previous)
        num_tokens, num_seqs = step.num_tokens, len(plan)
        bucket, pad, empty = self.bucket(num_tokens), self.max_tokens - num_tokens, self.max_seqs - num_seqs
        fields = torch.tensor(
            [
                step.audio_ids + [0] * pad,
                step.text_ids + [0] * pad,
                [int(u) for u in step.use_text] + [0] * pad,
                [int(c) for c in step.continuous] + [0] * pad,
                step.positions + [0] * pad,
                slot_mapping(step.entries, self.block_size) + [self.pool.scratch_slot] * pad,
                step.text_from + [-1] * pad,
                step.audio_from + [-1] * pad,
            ],
            dtype=torch.long,
        )
        runs = run_lists(step.entries, self.block_size)
        width = len(runs.block_tables[0])
        # Columns past `width` and rows of empty slots keep earlier steps' ids: valid blocks,
        # never read (context lengths bound every read).
        copy_in(self.fields, fields)
        tables = torch.tensor(runs.block_tables, dtype=torch.int32)
        copy_in(self.block_tables[:num_seqs, :width], tables)
        starts = runs.query_starts + [num_tokens] * empty + [bucket]  # empty slots, then the padding's run
        copy_in(self.query_starts, torch.tensor(starts, dtype=torch.int32))
        contexts = runs.context_lens + [0] * (empty + 1)
        copy_in(self.context_lens, torch.tensor(contexts, dtype=torch.int32))
        rows = step.logits_rows + [0] * (self.max_seqs - len(step.logits_rows))
        copy_in(self.logits_rows, torch.tensor(rows))
        if previous is not None and step.takes_sampled:
            take_sampled(self.fields[AUDIO : USE_TEXT + 1], self.fields[TEXT_FROM : AUDIO_FROM + 1], previous.samples)
        if step.features:
            at = to_device(torch.tensor(step.feature_positions), self.features.device)
            self.features.index_copy_(0, at, torch.cat(step.features).to(self.features.dtype))
        return bucket, step.sampling

    def batch(self, bucket: int) -> MixedBatch:
        """Views of the first `bucket` rows (every sequence slot and the full table width)."""
        f = self.fields[:, :bucket]
        runs = RunsMetadata(self.block_tables, self.query_starts, self.context_lens, self.use_kernel)
        attention = PagedAttention(self.pool, AttentionMetadata(f[SLOT], None, None, [], runs))
        return MixedBatch(
            f[AUDIO],
            f[TEXT],
            f[USE_TEXT],
            f[CONTINUOUS],
            self.features[:bucket],
            f[POSITION],
            self.logits_rows,
            attention,
        )
