"""The paged KV pool and the AttentionBackend that reads and writes it.

Follows nano-vllm's attention layer (store new K/V by slot mapping, attend through block
tables), in plain PyTorch so it runs on the CPU and any GPU:
- `KVPool`: one preallocated tensor [2, layers, num_blocks, block_size, Hkv, D] for every
  trunk and MIMO layer (layer_idx order of the model: trunk 0..L-1, then MIMO L..L+M-1);
- `AttentionMetadata`: per step, where each new token's K/V goes (slot mapping) and which
  blocks hold each sequence's keys; built once per step, shared by every layer;
- `PagedAttention`: the model's attention seam. Single-query rows (decodes) of all
  sequences run as one padded, masked sdpa call; longer prefill chunks run per sequence with
  a bottom-right causal mask over the cached prefix plus the chunk. A flash-attn / paged
  kernel can replace `PagedAttention.__call__` without touching the model or the runner.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from kimiaudio.layers.attention import causal_attention

CPU_KV_BUDGET_BYTES = 2 << 30  # the pool budget on the CPU (config: engine.memory_fraction note)


class KVPool:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 device: torch.device | str, dtype: torch.dtype):
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Zeroed, not empty: padded key rows read unused slots, and 0 * NaN would poison them.
        shape = (2, num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        if torch.device(device).type == "cpu":
            # numpy's zeros come from calloc: the OS maps pages on first write, so a large CPU
            # pool costs neither start-up time (torch.zeros wrote 1.6 GB in about 1 s) nor
            # resident memory until it is used. Bytes, then the dtype: numpy has no bfloat16.
            nbytes = dtype.itemsize * num_layers * num_blocks * block_size * num_kv_heads * head_dim * 2
            self.kv = torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)
        else:
            self.kv = torch.zeros(shape, device=device, dtype=dtype)

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype.itemsize

    def keys(self, layer_idx: int) -> torch.Tensor:
        """[num_slots, Hkv, D] view of one layer's keys (slot = block * block_size + offset)."""
        return self.kv[0, layer_idx].flatten(0, 1)

    def values(self, layer_idx: int) -> torch.Tensor:
        return self.kv[1, layer_idx].flatten(0, 1)

    def blocks(self, kind: int, layer_idx: int) -> torch.Tensor:
        """[num_blocks, block_size * Hkv * D] view of one layer's keys (kind 0) or values (1):
        gathering whole rows of it with index_select is a few times faster on the CPU than
        advanced indexing of the 6-d pool."""
        return self.kv[kind, layer_idx].view(self.num_blocks, -1)


def pool_num_blocks(num_kv_blocks: int, memory_fraction: float, bytes_per_block: int, max_useful_blocks: int,
                    device: torch.device) -> int:
    """Blocks for the pool: the configured count, else memory_fraction of the free device
    memory (a fixed budget on the CPU), never more than can ever be in use at once."""
    if num_kv_blocks > 0:
        return num_kv_blocks
    if device.type == "cuda":
        # The driver's free memory counts what torch's allocator freed but keeps cached (a
        # previous engine's pool, load-time temporaries) as used: hand that back first.
        torch.cuda.empty_cache()
        free, _total = torch.cuda.mem_get_info(device)
        budget = int(free * memory_fraction)
    else:
        budget = CPU_KV_BUDGET_BYTES
    return max(0, min(budget // bytes_per_block, max_useful_blocks))


@dataclass
class PrefillChunk:
    """One sequence's multi-token chunk: rows [row_start, row_start + num_rows) of the batch."""

    row_start: int
    num_rows: int
    num_cached: int  # positions before the chunk whose K/V is already in the pool
    slots: torch.Tensor | None  # [num_cached + num_rows] slot of every key, None if num_cached == 0


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] long: pool slot of every new token
    decode_rows: slice | torch.Tensor | None  # [B] batch rows that are a sequence's only query
    decode_blocks: torch.Tensor | None  # [B * W] long: block tables of those sequences (padded to W)
    decode_mask: torch.Tensor | None  # [B, 1, 1, W * block_size] in the queries' dtype: 0 for a real key, -inf for padding
    prefills: list[PrefillChunk]

    @classmethod
    def build(cls, entries: list[tuple[list[int], int, int]], block_size: int, device: torch.device,
              dtype: torch.dtype = torch.float32) -> "AttentionMetadata":
        """entries: per sequence in batch order (block_table, num_computed, num_scheduled);
        dtype: the queries' (the additive mask's, which sdpa kernels may require to match)."""
        slot_mapping: list[int] = []
        decode_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillChunk] = []
        row = 0
        for table, start, count in entries:
            for p in range(start, start + count):
                slot_mapping.append(table[p // block_size] * block_size + p % block_size)
            context = start + count
            if count == 1:
                decode_rows.append(row)
                decode_tables.append(table[: -(-context // block_size)])
                decode_lens.append(context)
            else:
                slots = _slots(torch.tensor(table[: -(-context // block_size)]), block_size, context) if start else None
                prefills.append(PrefillChunk(row, count, start, None if slots is None else to_device(slots, device)))
            row += count
        decode = (None, None, None)
        if decode_rows:
            width = max(len(t) for t in decode_tables)
            blocks = to_device(torch.tensor([b for t in decode_tables for b in t + [0] * (width - len(t))]), device)
            lens = to_device(torch.tensor(decode_lens), device)
            padding = torch.arange(width * block_size, device=device)[None, :] >= lens[:, None]
            mask = torch.zeros(padding.shape, device=device, dtype=dtype).masked_fill_(padding, float("-inf"))
            # The scheduler puts decodes first: a slice then spares a gather and a scatter.
            rows = (slice(0, len(decode_rows)) if decode_rows[-1] == len(decode_rows) - 1
                    else to_device(torch.tensor(decode_rows), device))
            decode = (rows, blocks, mask[:, None, None, :])
        return cls(to_device(torch.tensor(slot_mapping), device), *decode, prefills)


def to_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fresh host tensor onto the device without a host-device synchronisation (a blocking
    copy waits for the GPU; the runner's one sync per step is the sampled tokens'). Safe: the
    host tensor is staged by CUDA before this returns and never written again. Every per-step
    input of the engine goes through here."""
    return values.to(device, non_blocking=True)


def _slots(table: torch.Tensor, block_size: int, length: int) -> torch.Tensor:
    """Block ids [n] -> slots of positions 0..length-1 [length]."""
    return (table[:, None] * block_size + torch.arange(block_size)).flatten()[:length]


class PagedAttention:
    """AttentionBackend over a KVPool for one step's batch (see AttentionMetadata)."""

    def __init__(self, pool: KVPool, metadata: AttentionMetadata):
        self.pool = pool
        self.meta = metadata

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] for the batch's new tokens -> [T, Hq, D]."""
        keys, values = self.pool.keys(layer_idx), self.pool.values(layer_idx)
        keys.index_copy_(0, self.meta.slot_mapping, k)
        values.index_copy_(0, self.meta.slot_mapping, v)
        if not self.meta.prefills:  # an all-decode step: every row is a decode, in order
            return self._decode(layer_idx, q)
        out = torch.empty_like(q)
        rows = self.meta.decode_rows
        if rows is not None:
            out[rows] = self._decode(layer_idx, q[rows])
        for chunk in self.meta.prefills:
            rows = slice(chunk.row_start, chunk.row_start + chunk.num_rows)
            if chunk.slots is None:  # nothing cached before: the chunk's own keys suffice
                out[rows] = causal_attention(q[rows], k[rows], v[rows])
            else:
                out[rows] = causal_attention(q[rows], keys.index_select(0, chunk.slots),
                                             values.index_select(0, chunk.slots))
        return out

    def _decode(self, layer_idx: int, q: torch.Tensor) -> torch.Tensor:
        """q [B, Hq, D], one query per sequence at its last position -> [B, Hq, D]."""
        batch, num_heads, head_dim = q.shape
        num_kv_heads = self.pool.kv.shape[-2]
        # Gather whole blocks: one index per block, not per slot. -> [B, K, Hkv, D]
        keys = self.pool.blocks(0, layer_idx).index_select(0, self.meta.decode_blocks)
        values = self.pool.blocks(1, layer_idx).index_select(0, self.meta.decode_blocks)
        keys = keys.view(batch, -1, num_kv_heads, head_dim).transpose(1, 2)
        values = values.view(batch, -1, num_kv_heads, head_dim).transpose(1, 2)
        group = num_heads // num_kv_heads
        # A sequence's single query sees all its keys, so the `group` query heads sharing a kv
        # head can ride in sdpa's query-length axis: q [B, Hkv, group, D] vs k [B, Hkv, K, D].
        qg = q.reshape(batch, num_kv_heads, group, head_dim)
        out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=self.meta.decode_mask)
        return out.reshape(batch, num_heads, head_dim)
