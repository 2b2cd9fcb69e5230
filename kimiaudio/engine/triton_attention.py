"""Triton kernels of the paged KV pool: store the new tokens' K/V, and decode attention.

Imported only when the kernels are used (layers/triton_support.py); the torch versions in
paged_attention.py are the reference the tests hold these to.

Decode attention follows the shape of vLLM's paged attention and flash-decoding, written
for this pool: one program per (sequence, kv head, partition of the context), holding the
`group` query heads that share the kv head (GQA) as the rows of one tile. It walks the
sequence's positions TILE at a time, finds each position's block through the block table,
and keeps an online softmax (running max, sum and weighted values in fp32). It reads only
the first context_lens[b] positions, whatever the table's width, so the grid and every
shape are fixed by the batch size and the table width: the kernel can live in a CUDA graph.
With few sequences the context is split into partitions that run in parallel, and a second
kernel merges their partial softmaxes.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

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


@triton.jit(do_not_specialize=["partition_size", "num_partitions"])
def _merge_partitions_kernel(
    context_lens_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    out_ptr,
    partition_size,
    num_partitions,
    stride_ob,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PARTS_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    context = tl.load(context_lens_ptr + seq).to(tl.int32)
    used = (context + partition_size - 1) // partition_size  # partitions that ran
    base = (seq * NUM_HEADS + head) * num_partitions
    s = tl.arange(0, PARTS_PAD)
    m_all = tl.max(tl.load(m_ptr + base + s, mask=s < used, other=float("-inf")), 0)
    d = tl.arange(0, HEAD_DIM)
    total = tl.sum(tl.zeros([CHUNK], tl.float32), 0)
    out = tl.zeros([HEAD_DIM], tl.float32)
    for first in range(0, used, CHUNK):  # CHUNK partitions at a time: [CHUNK, D] tiles stay small
        c = first + tl.arange(0, CHUNK)
        live = c < used
        w = tl.where(live, tl.exp2(tl.load(m_ptr + base + c, mask=live, other=0.0) - m_all), 0.0)
        total += tl.sum(tl.load(l_ptr + base + c, mask=live, other=0.0) * w, 0)
        acc = tl.load(acc_ptr + (base + c)[:, None] * HEAD_DIM + d[None, :], mask=live[:, None], other=0.0)
        out += tl.sum(acc * w[:, None], 0)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + d, (out / total).to(out_ptr.dtype.element_ty))


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slots_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cs,
    stride_ch,
    NUM_KV_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HEAD_DIM)
    mask = (h < NUM_KV_HEADS)[:, None]
    k = tl.load(k_ptr + token * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    dst = slot * stride_cs + h[:, None] * stride_ch + d[None, :]
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def store_kv_triton(
    keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """keys/values [num_slots, Hkv, D] (one layer of the pool) <- k/v [T, Hkv, D] at slots [T]."""
    tokens, num_kv_heads, head_dim = k.shape
    if tokens == 0:
        return
    k, v = _last_dim_contiguous(k), _last_dim_contiguous(v)
    _store_kv_kernel[(tokens,)](
        k,
        v,
        keys,
        values,
        slots,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        keys.stride(0),
        keys.stride(1),
        NUM_KV_HEADS=num_kv_heads,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
    )


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
) -> torch.Tensor:
    """q [B, Hq, D]; k/v_cache [num_blocks, block_size, Hkv, D]; block_tables [B, W] int32;
    context_lens [B] (>= 1 each) -> [B, Hq, D] in q's dtype. Scale 1/sqrt(D)."""
    batch, num_heads, head_dim = q.shape
    q = _last_dim_contiguous(q)
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    tile = 32 if head_dim >= 128 else 64
    max_context = block_tables.shape[1] * block_size
    size, parts = decode_partitions(batch, num_kv_heads, max_context, tile, _target_programs(q.device))
    out = torch.empty_like(q)
    single = parts == 1
    if single:
        m = denom = acc = out  # unused
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
        num_warps=4,
    )
    if not single:
        _merge_partitions_kernel[(batch, num_heads)](
            context_lens,
            m,
            denom,
            acc,
            out,
            size,
            parts,
            out.stride(0),
            out.stride(1),
            NUM_HEADS=num_heads,
            HEAD_DIM=head_dim,
            PARTS_PAD=triton.next_power_of_2(parts),
            CHUNK=16,
            num_warps=4,
        )
    return out
