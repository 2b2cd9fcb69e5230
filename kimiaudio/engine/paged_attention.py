"""The AttentionBackend of any step over the paged KV pool, and the per-step metadata it reads.

Follows nano-vllm's attention layer (store the new tokens' K/V by slot mapping, attend
through block tables):
- `RunsMetadata`: every sequence of a flat batch as a run of query rows at the end of its
  context (a prefill chunk, or one row for a decode), what the Triton prefill kernel reads
  (triton_prefill_attention.py: causal, grouped heads, the cached prefix read in place from
  the block table); fixed-shape tensors, so a padded mixed step can be captured too
  (mixed_batch.py);
- `AttentionMetadata` + `PagedAttention`: any step, decodes mixed with prefill chunks. With
  the kernels, one prefill-kernel call per layer over every row; on the torch path decode rows
  go through the decode attention (decode_attention.py) and each prefill chunk runs per
  sequence with a bottom-right causal mask over its cached prefix (gathered) plus the chunk.
The all-decode step's backend, which any step's decode rows share, is decode_attention.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from kimiaudio.audio.device_result import to_device
from kimiaudio.engine.decode_attention import DecodeMetadata, decode_attention
from kimiaudio.engine.kv_pool import KVPool, store_kv
from kimiaudio.layers.attention import causal_attention


def attention_kernel_supports(head_dim: int) -> bool:
    """Head sizes the Triton kernels take (tl.arange and tl.dot want powers of two >= 16)."""
    return 16 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0


@dataclass
class PrefillChunk:
    """One sequence's multi-token chunk: rows [row_start, row_start + num_rows) of the batch."""

    row_start: int
    num_rows: int
    num_cached: int  # positions before the chunk whose K/V is already in the pool
    slots: torch.Tensor | None  # [num_cached + num_rows] slot of every key, None if num_cached == 0


@dataclass
class RunsMetadata:
    """Every sequence of a batch as a run of query rows (triton_prefill_attention.py's input)."""

    block_tables: torch.Tensor  # [S, W] int32; entries past a sequence's own blocks name any valid block
    query_starts: torch.Tensor  # [S + 1] int32: run s is rows query_starts[s] up to query_starts[s + 1]
    context_lens: torch.Tensor  # [S] int32: keys of each sequence, its run's own included
    use_kernel: bool = True  # False: the torch reference (runs_attention), which reads them on the host


class RunLists(NamedTuple):
    """RunsMetadata's contents on the host."""

    block_tables: list[list[int]]
    query_starts: list[int]
    context_lens: list[int]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] long: pool slot of every new token
    decode_rows: slice | torch.Tensor | None  # [B] batch rows that are a sequence's only query
    decode: DecodeMetadata | None  # of those rows
    prefills: list[PrefillChunk]
    runs: RunsMetadata | None = None  # with the kernels: every row, in one call per layer

    @classmethod
    def build(
        cls,
        entries: list[tuple[list[int], int, int]],
        block_size: int,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        use_kernel: bool = False,
    ) -> AttentionMetadata:
        """entries: per sequence in batch order (block_table, num_computed, num_scheduled);
        dtype: the queries' (the additive mask's, which sdpa kernels may require to match);
        use_kernel: every row goes through the Triton prefill kernel (no mask, no gather)."""
        slots = to_device(torch.tensor(slot_mapping(entries, block_size)), device)
        if use_kernel:
            return cls(slots, None, None, [], _runs(entries, block_size, device))
        decode_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillChunk] = []
        row = 0
        for table, start, count in entries:
            context = start + count
            if count == 1:
                decode_rows.append(row)
                decode_tables.append(table[: -(-context // block_size)])
                decode_lens.append(context)
            else:
                keys = _slots(torch.tensor(table[: -(-context // block_size)]), block_size, context) if start else None
                prefills.append(PrefillChunk(row, count, start, None if keys is None else to_device(keys, device)))
            row += count
        rows, decode = None, None
        if decode_rows:
            width = max(len(t) for t in decode_tables)
            tables = torch.tensor([t + t[-1:] * (width - len(t)) for t in decode_tables], dtype=torch.int32)
            decode = DecodeMetadata.create(
                to_device(tables, device), to_device(torch.tensor(decode_lens), device), block_size, dtype, False
            )
            # The scheduler puts decodes first: a slice then spares a gather and a scatter.
            rows = (
                slice(0, len(decode_rows))
                if decode_rows[-1] == len(decode_rows) - 1
                else to_device(torch.tensor(decode_rows), device)
            )
        return cls(slots, rows, decode, prefills)


def slot_mapping(entries: list[tuple[list[int], int, int]], block_size: int) -> list[int]:
    """The pool slot of every position of (block_table, start, count) entries, in order."""
    slots = []
    for table, start, count in entries:
        slots += [table[p // block_size] * block_size + p % block_size for p in range(start, start + count)]
    return slots


def run_lists(entries: list[tuple[list[int], int, int]], block_size: int) -> RunLists:
    """(block_table, start, count) entries -> their runs on the host: block tables cut to the
    blocks each context uses and padded to one width with their last block, run starts (one
    more than entries) and context lengths."""
    tables = [table[: -(-(start + count) // block_size)] for table, start, count in entries]
    width = max(len(t) for t in tables)
    starts = [0]
    for _, _, count in entries:
        starts.append(starts[-1] + count)
    padded = [t + t[-1:] * (width - len(t)) for t in tables]
    return RunLists(padded, starts, [start + count for _, start, count in entries])


def _runs(entries: list[tuple[list[int], int, int]], block_size: int, device: torch.device) -> RunsMetadata:
    runs = run_lists(entries, block_size)
    return RunsMetadata(
        to_device(torch.tensor(runs.block_tables, dtype=torch.int32), device),
        to_device(torch.tensor(runs.query_starts, dtype=torch.int32), device),
        to_device(torch.tensor(runs.context_lens, dtype=torch.int32), device),
    )


def _slots(table: torch.Tensor, block_size: int, length: int) -> torch.Tensor:
    """Block ids [n] -> slots of positions 0..length-1 [length] (long, on the table's device)."""
    offsets = torch.arange(block_size, device=table.device)
    return (table.long()[:, None] * block_size + offsets).flatten()[:length]


class PagedAttention:
    """AttentionBackend over a KVPool for one step's batch (see AttentionMetadata)."""

    def __init__(self, pool: KVPool, metadata: AttentionMetadata):
        self.pool = pool
        self.meta = metadata

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] for the batch's new tokens -> [T, Hq, D]."""
        runs = self.meta.runs
        store_kv(self.pool, layer_idx, self.meta.slot_mapping, k, v, runs is not None and runs.use_kernel)
        if runs is not None:
            return runs_attention(self.pool, layer_idx, q, runs)
        decode = self.meta.decode
        if not self.meta.prefills and decode is not None:  # an all-decode step: every row is a decode, in order
            return decode_attention(self.pool, layer_idx, q, decode)
        keys, values = self.pool.keys(layer_idx), self.pool.values(layer_idx)
        out = torch.empty_like(q)
        rows = self.meta.decode_rows
        if rows is not None and decode is not None:
            out[rows] = decode_attention(self.pool, layer_idx, q[rows], decode)
        for chunk in self.meta.prefills:
            rows = slice(chunk.row_start, chunk.row_start + chunk.num_rows)
            if chunk.slots is None:  # nothing cached before: the chunk's own keys suffice
                out[rows] = causal_attention(q[rows], k[rows], v[rows])
            else:
                out[rows] = causal_attention(
                    q[rows], keys.index_select(0, chunk.slots), values.index_select(0, chunk.slots)
                )
        return out


def runs_attention(pool: KVPool, layer_idx: int, q: torch.Tensor, runs: RunsMetadata) -> torch.Tensor:
    """q [T, Hq, D], the batch's runs of query rows (their K/V already in the pool) -> [T, Hq, D]:
    the Triton prefill kernel, or its torch reference (one gather and sdpa per run, the runs read
    on the host; rows outside every run, or of a run with no key, come out zero)."""
    if runs.use_kernel:
        from kimiaudio.engine.triton_prefill_attention import paged_prefill_attention_triton

        return paged_prefill_attention_triton(
            q, pool.kv[0, layer_idx], pool.kv[1, layer_idx], runs.block_tables, runs.query_starts, runs.context_lens
        )
    keys, values = pool.keys(layer_idx), pool.values(layer_idx)
    starts, contexts = runs.query_starts.tolist(), runs.context_lens.tolist()
    out = torch.zeros_like(q)
    for s, context in enumerate(contexts):
        rows = slice(starts[s], starts[s + 1])
        if context and starts[s + 1] > starts[s]:
            table = runs.block_tables[s, : -(-context // pool.block_size)]
            slots = _slots(table, pool.block_size, context)
            out[rows] = causal_attention(q[rows], keys.index_select(0, slots), values.index_select(0, slots))
    return out
