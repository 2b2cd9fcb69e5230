"""The AttentionBackend of an all-decode step over the paged KV pool, and the metadata it reads.

Follows nano-vllm's attention layer (store the new tokens' K/V by slot mapping, attend
through block tables):
- `DecodeMetadata`: single-query rows (decodes); row i attends to the first context_lens[i]
  positions of its block table. Fixed-shape tensors only, so the all-decode step can be
  captured in a CUDA graph (see decode_batch.py);
- `PagedDecodeAttention`: the backend of an all-decode step (the static-shape path);
- `decode_attention`: what it runs, and what the decode rows of a mixed step run on the torch
  path (paged_attention.py).
Decode attention has two implementations: the Triton kernel (CUDA, triton_attention.py: one
kernel per layer reading only a sequence's own blocks) and the torch gather of whole blocks +
one padded, masked sdpa call, which runs on the CPU and is the kernel's reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kimiaudio.engine.kv_pool import KVPool, store_kv
from kimiaudio.layers.attention import sdpa


@dataclass
class DecodeMetadata:
    block_tables: torch.Tensor  # [B, W] int32; entries past a row's own blocks name any valid block
    context_lens: torch.Tensor  # [B] long: keys each row attends to (its new token included)
    mask: torch.Tensor | None  # [B, 1, 1, W * block_size]: 0 / -inf in the queries' dtype; torch path only

    @classmethod
    def create(
        cls,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        block_size: int,
        dtype: torch.dtype,
        use_kernel: bool,
    ) -> DecodeMetadata:
        """Device tensors in, no host-device synchronisation (graph-safe)."""
        mask = None
        if not use_kernel:
            keys = torch.arange(block_tables.shape[1] * block_size, device=block_tables.device)
            padding = keys[None, :] >= context_lens[:, None]
            mask = torch.zeros(padding.shape, device=padding.device, dtype=dtype).masked_fill_(padding, float("-inf"))
            mask = mask[:, None, None, :]
        return cls(block_tables, context_lens, mask)


def decode_attention(pool: KVPool, layer_idx: int, q: torch.Tensor, meta: DecodeMetadata) -> torch.Tensor:
    """q [B, Hq, D], one query per sequence at its last position -> [B, Hq, D]."""
    if meta.mask is None:
        from kimiaudio.engine.triton_attention import paged_decode_attention_triton

        return paged_decode_attention_triton(
            q,
            pool.kv[0, layer_idx],
            pool.kv[1, layer_idx],
            meta.block_tables,
            meta.context_lens,
            pool.semaphores(q.shape[0] * pool.kv.shape[-2]),
        )
    batch, num_heads, head_dim = q.shape
    num_kv_heads = pool.kv.shape[-2]
    # Gather whole blocks: one index per block, not per slot. -> [B, K, Hkv, D]
    index = meta.block_tables.flatten()
    keys = pool.blocks(0, layer_idx).index_select(0, index)
    values = pool.blocks(1, layer_idx).index_select(0, index)
    keys = keys.view(batch, -1, num_kv_heads, head_dim).transpose(1, 2)
    values = values.view(batch, -1, num_kv_heads, head_dim).transpose(1, 2)
    group = num_heads // num_kv_heads
    # A sequence's single query sees all its keys, so the `group` query heads sharing a kv
    # head can ride in sdpa's query-length axis: q [B, Hkv, group, D] vs k [B, Hkv, K, D].
    qg = q.reshape(batch, num_kv_heads, group, head_dim)
    out = sdpa(qg, keys, values, attn_mask=meta.mask)
    return out.reshape(batch, num_heads, head_dim)


class PagedDecodeAttention:
    """AttentionBackend of an all-decode batch: row i is sequence i's one new token. With the
    Triton kernels it also takes q and k before RoPE (`fuses_rotary`, `rotate_and_attend`):
    one kernel rotates them and stores k and v."""

    def __init__(self, pool: KVPool, slot_mapping: torch.Tensor, meta: DecodeMetadata):
        self.pool = pool
        self.slot_mapping = slot_mapping  # [B] long
        self.meta = meta

    @property
    def fuses_rotary(self) -> bool:
        return self.meta.mask is None

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        store_kv(self.pool, layer_idx, self.slot_mapping, k, v, self.meta.mask is None)
        return decode_attention(self.pool, layer_idx, q, self.meta)

    def rotate_and_attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """As __call__, for q and k not yet rotated by cos/sin [B, 1, D] (Triton kernels only)."""
        from kimiaudio.engine.triton_kv_store import rotary_store_triton

        keys, values = self.pool.keys(layer_idx), self.pool.values(layer_idx)
        q = rotary_store_triton(keys, values, self.slot_mapping, q, k, v, cos, sin)
        return decode_attention(self.pool, layer_idx, q, self.meta)
