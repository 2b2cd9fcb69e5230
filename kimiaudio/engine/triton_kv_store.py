"""Triton kernels that write the new tokens' K/V into the paged KV pool (kv_pool.py).

Imported only when the kernels are used (layers/triton_support.py); kv_pool.py's store_kv
(index_copy, and layers/rotary.py) is the reference the tests hold these to.
- `store_kv_triton`: k and v of every token at its slot, one launch for both;
- `rotary_store_triton`: a decode step's q and k rotated (RoPE, as triton_ops.rotary rounds it)
  and k, v stored, in one launch instead of the rotary kernel and the store kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kimiaudio.layers.triton_ops import rotated_head


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


@triton.jit
def _rotary_store_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slots_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cos,
    stride_sin,
    stride_cs,
    stride_ch,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)  # q heads, then kv heads
    d = tl.arange(0, HEAD_DIM)
    cos_row = cos_ptr + token * stride_cos
    sin_row = sin_ptr + token * stride_sin
    if head < NUM_Q_HEADS:
        src = q_ptr + token * stride_qt + head * stride_qh
        tl.store(q_out_ptr + (token * NUM_Q_HEADS + head) * HEAD_DIM + d, rotated_head(src, cos_row, sin_row, HEAD_DIM))
    else:
        kv_head = head - NUM_Q_HEADS
        dst = tl.load(slots_ptr + token).to(tl.int64) * stride_cs + kv_head * stride_ch + d
        k = rotated_head(k_ptr + token * stride_kt + kv_head * stride_kh, cos_row, sin_row, HEAD_DIM)
        tl.store(k_cache_ptr + dst, k)
        tl.store(v_cache_ptr + dst, tl.load(v_ptr + token * stride_vt + kv_head * stride_vh + d))


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def store_kv_triton(
    keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """keys/values [num_slots, Hkv, D] (one layer of the pool) <- k/v [T, Hkv, D] at slots [T]."""
    tokens, num_kv_heads, head_dim = k.shape
    if tokens == 0:
        return
    k, v = last_dim_contiguous(k), last_dim_contiguous(v)
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


def rotary_store_triton(
    keys: torch.Tensor,
    values: torch.Tensor,
    slots: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> torch.Tensor:
    """One launch for what triton_ops.rotary and store_kv_triton do in two: q [T, Hq, D] and
    k [T, Hkv, D] rotated by cos/sin [T, 1, D], k and v [T, Hkv, D] (any row strides) written at
    slots [T] of keys/values [num_slots, Hkv, D] -> the rotated q, contiguous."""
    tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    q, k, v = last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v)
    q_out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    if tokens:
        _rotary_store_kernel[(tokens, num_heads + num_kv_heads)](
            q,
            k,
            v,
            cos,
            sin,
            q_out,
            keys,
            values,
            slots,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            cos.stride(0),
            sin.stride(0),
            keys.stride(0),
            keys.stride(1),
            NUM_Q_HEADS=num_heads,
            HEAD_DIM=head_dim,
            num_warps=1,
        )
    return q_out
