"""Static input buffers of the all-decode step, padded to a fixed set of batch sizes.

The step's inputs live in tensors allocated once: per row the audio id, text id, use_text
flag, position, slot of the new token and context length ([NUM_FIELDS, max_batch] long), and
a block table of fixed width W = ceil(max_model_len / block_size) ([max_batch, W] int32).
Each step writes them in place (two host-to-device copies on the current stream), so a CUDA
graph captured over views of these buffers replays any later step of the same padded size.

A step launched before the previous one's samples are read (engine/launched_step.py) has rows
whose ids the host does not know yet: their TEXT_FROM / AUDIO_FROM fields name the previous
step's row to take the sampled id from, on the device, after the copies (-1: the host's id,
also where the generation rules force the id whatever was sampled); such a row's use_text is
its text id's, as for any generated position (Sequence.append_token).

With CUDA graphs a step of B sequences is padded to the next of `decode_batch_sizes` (1, 2,
4, 8, then every 8 up to 64, every 16 beyond). Without them (the CPU) padding would only add
work: `batch_sizes` is None and the same views run eagerly with B rows (tests pad on the CPU
too, to check the padded rows). Padded rows hold token 0 at position 0, write their K/V into
the pool's scratch block and attend to its first slot only (context length 1): they read
nothing of any sequence, and their logits are discarded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kimiaudio.audio.device_result import copy_in
from kimiaudio.engine.decode_attention import DecodeMetadata, PagedDecodeAttention
from kimiaudio.engine.kv_pool import KVPool
from kimiaudio.engine.launched_step import LaunchedStep, row_ids, take_sampled
from kimiaudio.engine.sequence import Sequence
from kimiaudio.engine.step_plan import StepPlan

AUDIO, TEXT, USE_TEXT, POSITION, SLOT, CONTEXT, TEXT_FROM, AUDIO_FROM = range(8)
NUM_FIELDS = 8


def decode_batch_sizes(max_num_seqs: int) -> list[int]:
    """Padded batch sizes: 1, 2, 4, 8, then every 8 to 64, every 16 beyond, and max_num_seqs."""
    steps = [1, 2, 4, 8] + list(range(16, 64, 8)) + list(range(64, max(64, max_num_seqs), 16))
    return [s for s in steps if s < max_num_seqs] + [max_num_seqs]


@dataclass
class DecodeBatch:
    """Views of the static buffers for one padded batch size: what the decode forward reads."""

    audio_ids: torch.Tensor  # [Bp] long
    text_ids: torch.Tensor  # [Bp] long
    use_text: torch.Tensor  # [Bp] long, 0 or 1
    positions: torch.Tensor  # [Bp] long
    slot_mapping: torch.Tensor  # [Bp] long
    attention: PagedDecodeAttention


class DecodeInputs:
    def __init__(
        self,
        pool: KVPool,
        max_batch: int,
        max_model_len: int,
        dtype: torch.dtype,
        use_kernel: bool,
        batch_sizes: list[int] | None,
    ):
        self.pool = pool
        self.block_size = pool.block_size
        self.max_batch = max_batch
        # The padded sizes, ascending, the last max_batch; None: no padding.
        self.batch_sizes = batch_sizes
        self.max_blocks = -(-max_model_len // self.block_size)  # W: the block tables' fixed width
        self.dtype = dtype
        self.use_kernel = use_kernel
        device = pool.kv.device
        self.fields = torch.zeros(NUM_FIELDS, max_batch, dtype=torch.long, device=device)
        self.fields[SLOT] = pool.scratch_slot
        self.fields[CONTEXT] = 1
        self.block_tables = torch.full(
            (max_batch, self.max_blocks), pool.scratch_block, dtype=torch.int32, device=device
        )

    def padded_size(self, batch: int) -> int:
        if not 0 < batch <= self.max_batch:
            raise ValueError(f"a decode batch of {batch} rows: expected 1..{self.max_batch}")
        return batch if self.batch_sizes is None else next(s for s in self.batch_sizes if s >= batch)

    def fits(self, plan: StepPlan) -> bool:
        """True if every sequence is one decode row of a static batch (else: the eager path)."""
        return (
            len(plan) <= self.max_batch
            and plan.is_all_single
            and all(
                not seq.continuous_mask[seq.num_computed_tokens] and len(seq.block_table) <= self.max_blocks
                for seq in plan.seqs
            )
        )

    def prepare(self, seqs: list[Sequence], previous: LaunchedStep | None = None) -> tuple[int, int]:
        """Write the step's rows (then padding) into the buffers, on the current stream; rows
        at a position still unresolved take their ids from `previous`'s samples on the device.
        -> (padded batch size, block-table columns the rows use); `batch` gives the views."""
        padded, pad = self.padded_size(len(seqs)), self.max_batch - len(seqs)
        bs, scratch = self.block_size, self.pool.scratch_block
        positions = [seq.num_computed_tokens for seq in seqs]
        ids = [row_ids(seq, p, previous) for seq, p in zip(seqs, positions)]
        # One host tensor per buffer, built from lists: one copy to the device, not one per row.
        fields = torch.tensor(
            [
                [row.audio for row in ids] + [0] * pad,
                [row.text for row in ids] + [0] * pad,
                [row.use_text for row in ids] + [0] * pad,
                positions + [0] * pad,
                [seq.block_table[p // bs] * bs + p % bs for seq, p in zip(seqs, positions)] + [scratch * bs] * pad,
                [p + 1 for p in positions] + [1] * pad,
                [row.text_from for row in ids] + [-1] * pad,
                [row.audio_from for row in ids] + [-1] * pad,
            ],
            dtype=torch.long,
        )
        width = max(len(seq.block_table) for seq in seqs)
        tables = torch.tensor(
            [seq.block_table + [scratch] * (width - len(seq.block_table)) for seq in seqs]
            + [[scratch] * width] * (padded - len(seqs)),
            dtype=torch.int32,
        )
        # Columns past `width` keep earlier steps' ids: valid blocks, never read (context_lens).
        copy_in(self.fields, fields)
        copy_in(self.block_tables[:padded, :width], tables)
        if previous is not None and any(row.text_from >= 0 or row.audio_from >= 0 for row in ids):
            take_sampled(self.fields[AUDIO : USE_TEXT + 1], self.fields[TEXT_FROM : AUDIO_FROM + 1], previous.samples)
        return padded, width

    def batch(self, padded: int, width: int) -> DecodeBatch:
        """Views of the first `padded` rows, block tables `width` columns wide: W for a graph,
        else as wide as the rows need (the torch path gathers every column)."""
        f = self.fields[:, :padded]
        meta = DecodeMetadata.create(
            self.block_tables[:padded, :width], f[CONTEXT], self.block_size, self.dtype, self.use_kernel
        )
        return DecodeBatch(
            f[AUDIO], f[TEXT], f[USE_TEXT], f[POSITION], f[SLOT], PagedDecodeAttention(self.pool, f[SLOT], meta)
        )
