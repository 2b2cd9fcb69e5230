"""The inner loop step that the paged attention kernels share (Triton device functions).

Both the decode kernel (triton_attention.py) and the prefill kernel
(triton_prefill_attention.py) walk a sequence's keys a tile at a time: `load_kv_tile` finds
each key position's block through the block table and loads one kv head's K and V rows from
the pool; `attend_tile` folds the tile into the running online softmax of the query rows
(max, sum and weighted values in fp32, scores in log2 units). Imported only with the kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(
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
):
    """pos [N] key positions (valid [N]: which exist) of the sequence whose block table row is
    `table`, d [D] -> K, V [N, D] of kv head `kv_head` (zero rows where not valid)."""
    block = tl.load(table + pos // block_size, mask=valid, other=0).to(tl.int64)
    offset = (pos % block_size).to(tl.int64)
    k = tl.load(
        k_cache_ptr + block[:, None] * stride_kb + offset[:, None] * stride_ks + kv_head * stride_kh + d[None, :],
        mask=valid[:, None],
        other=0.0,
    )
    v = tl.load(
        v_cache_ptr + block[:, None] * stride_vb + offset[:, None] * stride_vs + kv_head * stride_vh + d[None, :],
        mask=valid[:, None],
        other=0.0,
    )
    return k, v


@triton.jit
def attend_tile(q, k, v, seen, m, denom, acc, scale_log2, DOT_FP32: tl.constexpr):
    """q [M, D] (fp32 when DOT_FP32) against K, V [N, D] where seen [M, N]: the running max m
    [M], sum denom [M] and weighted values acc [M, D] after this tile. A row that has seen no
    key yet keeps m = -inf and is shifted by 0, never by -inf (no NaN)."""
    if DOT_FP32:
        s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")  # [M, N]
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(seen, s * scale_log2, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - shift)
    p = tl.exp2(s - shift[:, None])
    denom = denom * alpha + tl.sum(p, 1)
    if DOT_FP32:
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, denom, acc
