"""The paged KV pool: one preallocated tensor for the keys and values of every layer.

Layout [2, layers, num_blocks + 1, block_size, Hkv, D] (keys, then values; trunk layers
0..L-1, then MIMO layers L..L+M-1, the model's layer_idx order). Blocks 0..num_blocks-1 are
handed out by the BlockManager; the extra last one is the scratch block: the padded rows of
a static-shape decode batch (CUDA graphs) write their K/V there and read only its first slot,
so they never touch a sequence's blocks and never see an empty softmax. The pool also holds
the decode attention kernel's semaphores (triton_attention.py), one zeroed int32 per sequence
and kv head of a batch. `store_kv` writes a step's new K/V at their slots, for every attention
backend (decode_attention.py, paged_attention.py).
"""

from __future__ import annotations

import numpy as np
import torch

from kimiaudio.config import EngineConfig


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        device: torch.device | str,
        dtype: torch.dtype,
    ):
        self.num_layers = num_layers
        self.num_blocks = num_blocks  # usable blocks, without the scratch block
        self.block_size = block_size
        self.scratch_block = num_blocks
        # Zeroed, not empty: padded key rows read unused slots, and 0 * NaN would poison them.
        shape = (2, num_layers, num_blocks + 1, block_size, num_kv_heads, head_dim)
        if torch.device(device).type == "cpu":
            # numpy's zeros come from calloc: the OS maps pages on first write, so a large CPU
            # pool costs neither start-up time (torch.zeros wrote 1.6 GB in about 1 s) nor
            # resident memory until it is used. Bytes, then the dtype: numpy has no bfloat16.
            nbytes = dtype.itemsize * int(np.prod(shape))
            self.kv = torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)
        else:
            self.kv = torch.zeros(shape, device=device, dtype=dtype)
        # Every size made stays alive: a captured graph keeps the address it was captured with.
        self._semaphores = [torch.zeros(0, dtype=torch.int32, device=device)]

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype.itemsize

    def semaphores(self, count: int) -> torch.Tensor:
        """At least `count` zeroed int32, each left zeroed by the kernel that uses it: made anew
        for a larger batch than any before (the largest graph's eager warm-up runs first)."""
        if self._semaphores[-1].numel() < count:
            self._semaphores.append(torch.zeros(count, dtype=torch.int32, device=self.kv.device))
        return self._semaphores[-1]

    @property
    def scratch_slot(self) -> int:
        return self.scratch_block * self.block_size

    def keys(self, layer_idx: int) -> torch.Tensor:
        """[num_slots, Hkv, D] view of one layer's keys (slot = block * block_size + offset)."""
        return self.kv[0, layer_idx].flatten(0, 1)

    def values(self, layer_idx: int) -> torch.Tensor:
        return self.kv[1, layer_idx].flatten(0, 1)

    def blocks(self, kind: int, layer_idx: int) -> torch.Tensor:
        """[num_blocks + 1, block_size * Hkv * D] view of one layer's keys (kind 0) or values (1):
        gathering whole rows of it with index_select is a few times faster on the CPU than
        advanced indexing of the 6-d pool."""
        return self.kv[kind, layer_idx].flatten(1)


def max_useful_blocks(config: EngineConfig) -> int:
    """The most blocks ever in use at once: max_num_seqs sequences of max_model_len positions."""
    return config.max_num_seqs * -(-config.max_model_len // config.block_size)


def pool_num_blocks(config: EngineConfig, planned_blocks: int | None) -> int:
    """Usable blocks of the pool (the scratch block comes on top): engine.num_kv_blocks when
    set, else the memory plan's (pipeline/memory_plan.py), else (an engine run alone: a bench,
    a test) as many as can ever be in use; never more than that."""
    if config.num_kv_blocks > 0:
        return config.num_kv_blocks
    useful = max_useful_blocks(config)
    return useful if planned_blocks is None else max(0, min(planned_blocks, useful))


def store_kv(
    pool: KVPool, layer_idx: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor, use_kernel: bool
) -> None:
    """Write k/v [T, Hkv, D] of the new tokens at their slots [T] of one layer."""
    if use_kernel:
        from kimiaudio.engine.triton_kv_store import store_kv_triton

        store_kv_triton(pool.keys(layer_idx), pool.values(layer_idx), slot_mapping, k, v)
        return
    pool.keys(layer_idx).index_copy_(0, slot_mapping, k)
    pool.values(layer_idx).index_copy_(0, slot_mapping, v)
