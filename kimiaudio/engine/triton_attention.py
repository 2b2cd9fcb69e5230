"""The Triton kernel of decode attention over the paged KV pool (storing into the pool is
triton_kv_store.py's).

Imported only when the kernels are used (layers/triton_support.py); the torch version in
decode_attention.py is the reference the tests hold these to.

Decode attention follows the shape of vLLM's paged attention and flash-decoding, written
for this pool: one program per (sequence, kv head, partition of the context), holding the
`group` query heads that share the kv head (GQA) as the rows of one tile. It walks the
sequence's positions TILE at a time, finds each position's block through the block table,
and keeps an online softmax (running max, sum and weighted values in fp32). It reads only
the first context_lens[b] positions, whatever the table's width, so the grid and every
shape are fixed by the batch size and the table width: the kernel can live in a CUDA graph.
With few sequences the context is split into partitions that run in parallel; each writes its
partial softmax (running max, sum, weighted values) and counts itself on its (sequence, kv head)
semaphore, and the last of them merges the partials of the group's heads in the same launch (a
second kernel cost a launch a layer, 0.08 ms a step at batch 1) and resets the semaphore. The
semaphores are the pool's (KVPool.semaphores): zeroed once, left zeroed by every launch.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kimiaudio.engine.triton_kv_store import last_dim_contiguous
from kimiaudio.engine.triton_paged_tiles import attend_tile, load_kv_tile
from kimiaudio.layers.triton_support import interpreting

LOG2E = 1.4426950408889634
# Integer arguments that vary between eager steps (the tables' width sets the partitions):
# unspecialised, so a new value never compiles a new kernel variant in the middle of serving.
VARYING = ["block_size", "partition_size", "num_partitions", "stride_bt"]


@triton.jit(do_not_specialize=VARYING)
def _decode_partition_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    semaphore_ptr,
    scale_log2,
    block_size,
    partition_size,
    num_partitions,
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    TILE: tl.constexpr,
    SINGLE: tl.constexpr,
    DOT_FP32: tl.constexpr,
    PARTS_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    context = tl.load(context_lens_ptr + seq).to(tl.int32)
    start = part * partition_size
    if start < context:
        end = tl.minimum(start + partition_size, context)
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, HEAD_DIM)
        t = tl.arange(0, TILE)
        heads = kv_head * GROUP + g
        rows = g < GROUP
        q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=rows[:, None], other=0.0)
        if DOT_FP32:
            q = q.to(tl.float32)
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max of the scores (log2 units)
        denom = tl.zeros([GROUP_PAD], tl.float32)  # running sum of exp2(score - m)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)  # running sum of exp2(score - m) * v
        table = block_tables_ptr + seq * stride_bt
        for tile_start in range(start, end, TILE):
            pos = tile_start + t  # [TILE] positions
            valid = pos < end
            k, v = load_kv_tile(
                k_cache_ptr,
                v_cache_ptr,
                table,
                pos,
                valid,
                kv_head,
                d,
                block_size,
                stride_kb,
                stride_ks,
                stride_kh,
                stride_vb,
                stride_vs,
                stride_vh,
            )  # [TILE, D] each
            m, denom, acc = attend_tile(q, k, v, valid[None, :], m, denom, acc, scale_log2, DOT_FP32)
        if SINGLE:
            out = acc / denom[:, None]
            tl.store(
                out_ptr + seq * stride_ob + heads[:, None] * stride_oh + d[None, :],
                out.to(out_ptr.dtype.element_ty),
                mask=rows[:, None],
            )
        else:
            # Partials [B, Hq, S] (m, denom) and [B, Hq, S, D] (acc), contiguous.
            index = (seq * GROUP * tl.num_programs(1) + heads) * num_partitions + part
            tl.store(m_ptr + index, m, mask=rows)
            tl.store(l_ptr + index, denom, mask=rows)
            tl.store(acc_ptr + index[:, None] * HEAD_DIM + d[None, :], acc, mask=rows[:, None])
    if not SINGLE:  # every partition counts in, empty ones too; the last merges the group's heads
        tl.debug_barrier()  # this program's partials are all written before it counts itself
        semaphore = semaphore_ptr + seq * tl.num_programs(1) + kv_head
        if tl.atomic_add(semaphore, 1, sem="acq_rel") == num_partitions - 1:
            for g in tl.static_range(GROUP):
                head = kv_head * GROUP + g
                base = (seq * GROUP * tl.num_programs(1) + head) * num_partitions
                dst = out_ptr + seq * stride_ob + head * stride_oh
                _merge_head(context, m_ptr, l_ptr, acc_ptr, dst, base, partition_size, HEAD_DIM, PARTS_PAD, CHUNK)
            tl.atomic_xchg(semaphore, 0)


@triton.jit
def _merge_head(
    context,
    m_ptr,
    l_ptr,
    acc_ptr,
    out_ptr,
    base,
    partition_size,
    HEAD_DIM: tl.constexpr,
    PARTS_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """One head's output from its partitions' partial softmaxes at base .. base + used (loaded
    past L1: other programs wrote them)."""
    used = (context + partition_size - 1) // partition_size  # partitions that ran
    s = tl.arange(0, PARTS_PAD)
    m_all = tl.max(tl.load(m_ptr + base + s, mask=s < used, other=float("-inf"), cache_modifier=".cg"), 0)
    d = tl.arange(0, HEAD_DIM)
    total = tl.sum(tl.zeros([CHUNK], tl.float32), 0)
    out = tl.zeros([HEAD_DIM], tl.float32)
    for first in range(0, used, CHUNK):  # CHUNK partitions at a time: [CHUNK, D] tiles stay small
        c = first + tl.arange(0, CHUNK)
        live = c < used
        m = tl.load(m_ptr + base + c, mask=live, other=0.0, cache_modifier=".cg")
        w = tl.where(live, tl.exp2(m - m_all), 0.0)
        total += tl.sum(tl.load(l_ptr + base + c, mask=live, other=0.0, cache_modifier=".cg") * w, 0)
        acc = tl.load(
            acc_ptr + (base + c)[:, None] * HEAD_DIM + d[None, :], mask=live[:, None], other=0.0, cache_modifier=".cg"
        )
        out += tl.sum(acc * w[:, None], 0)
    tl.store(out_ptr + d, (out / total).to(out_ptr.dtype.element_ty))


@functools.cache
def _target_programs(device: torch.device) -> int:
    """Programs worth launching at once: two per SM (a fixed count on the CPU interpreter)."""
    if device.type != "cuda":
        return 64
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


def decode_partitions(batch: int, num_kv_heads: int, max_context: int, tile: int, target: int) -> tuple[int, int]:
    """-> (partition size, number of partitions): split the context only while the batch
    alone leaves SMs idle, in partitions of whole tiles."""
    wanted = max(1, min(target // max(1, batch * num_kv_heads), -(-max_context // tile)))
    size = -(-max_context // wanted)
    size = -(-size // tile) * tile
    return size, -(-max_context // size)


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    semaphores: torch.Tensor,
) -> torch.Tensor:
    """q [B, Hq, D]; k/v_cache [num_blocks, block_size, Hkv, D]; block_tables [B, W] int32;
    context_lens [B] (>= 1 each) -> [B, Hq, D] in q's dtype. Scale 1/sqrt(D). semaphores: at
    least B * Hkv zeroed int32 (KVPool.semaphores), left zeroed."""
    batch, num_heads, head_dim = q.shape
    q = last_dim_contiguous(q)
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    tile = 32 if head_dim >= 128 else 64
    max_context = block_tables.shape[1] * block_size
    size, parts = decode_partitions(batch, num_kv_heads, max_context, tile, _target_programs(q.device))
    out = torch.empty_like(q)
    single = parts == 1
    if single:
        m = denom = acc = out  # unused
    elif semaphores.numel() < batch * num_kv_heads:
        raise ValueError(f"decode attention: {semaphores.numel()} semaphores for {batch} x {num_kv_heads} merges")
    else:
        m = torch.empty(batch, num_heads, parts, device=q.device, dtype=torch.float32)
        denom = torch.empty_like(m)
        acc = torch.empty(batch, num_heads, parts, head_dim, device=q.device, dtype=torch.float32)
    _decode_partition_kernel[(batch, num_kv_heads, parts)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        m,
        denom,
        acc,
        semaphores,
        head_dim**-0.5 * LOG2E,
        block_size,
        size,
        parts,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        TILE=tile,
        SINGLE=single,
        DOT_FP32=q.dtype == torch.float32 or interpreting(),
        PARTS_PAD=triton.next_power_of_2(parts),
        CHUNK=16,
        num_warps=4,
    )
    return out
