"""The skinny GEMM: x [M, K] @ (W [N, K] * scale [N])^T + bias for few rows, one Triton kernel
for 8-bit (fp8 e4m3, int8) and 16-bit weights, the tile per M bucket from gemm_tiles.py.

A decode step reads every weight once, so its GEMMs are bound by the weight bytes; this kernel
reads each weight tile once (8-bit weights at one byte each), converts it in registers straight
to the compute dtype (bf16 for tl.dot, fp32 for the CUDA-core GEMV; weight_widening.py), and
applies the per-output scale and the bias to the fp32 accumulator once, in the epilogue. A
program reads its rows of activations once per K block for all BLOCK_N outputs. `gated`: the input is the fused gate/up
GEMM's output [M, 2K] and the kernel multiplies silu(gate) * up (each rounded to the dtype, as
activation.silu_and_mul) as it loads it, so the MLP's down projection needs no kernel before it.

Split-K: when the output's tiles alone give too few programs (o_proj and down_proj have 3,584
outputs: 56 tiles of 64), K is split among programs and the partial sums are reduced in the same
launch: each program stores its fp32 partial [BLOCK_M, BLOCK_N] tile, then counts itself on the
tile's semaphore (one int32, acquire-release); the last to arrive sums the partials in split
order, applies the epilogue and resets the semaphore to 0 for the next launch. Against fp32
atomics into an output buffer this needs no zeroing kernel before and no cast kernel after, and
the sum does not depend on which program finishes first: the same inputs give the same bits.
The semaphores belong to the calling layer (gemm_tiles.LayerTiles), so products on two
streams never share one; the partials are a fresh allocation of the call.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kimiaudio.layers.gemm_tiles import SEMAPHORES, Tile, split_k
from kimiaudio.layers.triton_ops import silu_mul
from kimiaudio.layers.triton_support import interpreting
from kimiaudio.layers.weight_widening import widen

# Programs the interpreter aims for (it runs them one by one): small, but enough that the
# tests' shapes split K.
_INTERPRETER_PROGRAMS = 8


@triton.jit
def _activations(ptrs, mask, half, GATED: tl.constexpr):
    """The activation tile at `ptrs`; GATED: silu(gate) * up, the up half `half` elements on."""
    if GATED:
        x = silu_mul(ptrs, mask, half)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0)
    return x


@triton.jit
def _gemv_row(x_ptr, w, k0, ks, k_ok, row, M, K, stride_xm, GATED: tl.constexpr):
    """One activation row's products with the converted weight tile w [BLOCK_N, BLOCK_K],
    summed over K -> [BLOCK_N]. A thread holds 16 consecutive weights of a weight row (one
    16-byte load), so most of the sum is its own; a few shuffles finish it."""
    row_ok = (row + 0 * ks) < M  # a tensor: the interpreter's masks cannot mix in a scalar
    x = _activations(x_ptr + row * stride_xm + k0 + ks, k_ok & row_ok, K, GATED).to(tl.float32)
    return tl.sum(w * x[None, :], 1)


@triton.jit
def _gemv(
    x_ptr,
    w_tile,
    first,
    M,
    K,
    k_start,
    k_end,
    stride_xm,
    col_ok,
    ks,
    GATED: tl.constexpr,
    EVEN_K: tl.constexpr,
    ASM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Rows first .. first + BLOCK_M (1, 2 or 4) on the CUDA cores -> [BLOCK_M, BLOCK_N] fp32:
    each weight converted once to fp32 and multiplied by every row (one accumulator a row)."""
    BLOCK_N: tl.constexpr = w_tile.shape[0]
    BLOCK_K: tl.constexpr = w_tile.shape[1]
    acc0 = tl.zeros([BLOCK_N], tl.float32)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
    for k0 in range(k_start, k_end, BLOCK_K):
        if EVEN_K:
            k_ok = ks < BLOCK_K
            w = tl.load(w_tile + k0, mask=col_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + ks) < K
            w = tl.load(w_tile + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        w = widen(w, tl.float32, ASM)
        acc0 += _gemv_row(x_ptr, w, k0, ks, k_ok, first, M, K, stride_xm, GATED)
        if BLOCK_M > 1:
            acc1 += _gemv_row(x_ptr, w, k0, ks, k_ok, first + 1, M, K, stride_xm, GATED)
        if BLOCK_M > 2:
            acc2 += _gemv_row(x_ptr, w, k0, ks, k_ok, first + 2, M, K, stride_xm, GATED)
            acc3 += _gemv_row(x_ptr, w, k0, ks, k_ok, first + 3, M, K, stride_xm, GATED)
    if BLOCK_M == 1:
        acc = acc0[None, :]
    elif BLOCK_M == 2:
        acc = tl.trans(tl.join(acc0, acc1))
    else:
        # [BLOCK_N, 2, 2] holding row 2j + i at [:, i, j] -> [4, BLOCK_N]
        acc = tl.reshape(tl.permute(tl.join(tl.join(acc0, acc1), tl.join(acc2, acc3)), (2, 1, 0)), (4, BLOCK_N))
    return acc


@triton.jit
def _epilogue(acc, scale_ptr, bias_ptr, out_ptr, rows, cols, col_ok, mask, stride_om, HAS_SCALE, HAS_BIAS):
    """acc [BLOCK_M, BLOCK_N] fp32 -> (acc * scale + bias) rounded once to the output dtype."""
    if HAS_SCALE:
        acc = acc * tl.load(scale_ptr + cols, mask=col_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M", "blocks_per_split"])
def _skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    partial_ptr,
    semaphore_ptr,
    M,
    N,
    K,
    blocks_per_split,
    stride_xm,
    stride_wn,
    stride_om,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    DOT: tl.constexpr,
    DOT_FP32: tl.constexpr,
    EVEN_K: tl.constexpr,
    ASM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    tile = tl.program_id(0)  # the row tiles of one column tile are neighbours: its weights hit L2
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    m_tiles = tl.cdiv(M, BLOCK_M)
    rows = (tile % m_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (tile // m_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    k_start = split * blocks_per_split * BLOCK_K  # a multiple of BLOCK_K: aligned vector loads
    k_end = tl.minimum(K, k_start + blocks_per_split * BLOCK_K)
    w_tile = w_ptr + cols[:, None] * stride_wn + ks[None, :]  # [BLOCK_N, BLOCK_K], K contiguous
    if DOT:
        x_tile = x_ptr + rows[:, None] * stride_xm + ks[None, :]  # [BLOCK_M, BLOCK_K]
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)  # out^T: the weight rows lead
        for k0 in range(k_start, k_end, BLOCK_K):
            if EVEN_K:  # no mask along K: the loads stay 16-byte vectors
                w = tl.load(w_tile + k0, mask=col_ok[:, None], other=0.0)
                x = _activations(x_tile + k0, row_ok[:, None], K, GATED)
            else:
                k_ok = (k0 + ks) < K
                w = tl.load(w_tile + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
                x = _activations(x_tile + k0, row_ok[:, None] & k_ok[None, :], K, GATED)
            # The weight tile is the MMA's left operand: its rows fill the 64-row side.
            if DOT_FP32:
                acc = tl.dot(widen(w, tl.float32, ASM), tl.trans(x.to(tl.float32)), acc, input_precision="ieee")
            else:  # fp8 and int8 values are exact in bf16 / fp16
                acc = tl.dot(widen(w, x.dtype, ASM), tl.trans(x), acc)
        acc = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    else:
        rows_from = (tile % m_tiles) * BLOCK_M
        acc = _gemv(x_ptr, w_tile, rows_from, M, K, k_start, k_end, stride_xm, col_ok, ks, GATED, EVEN_K, ASM, BLOCK_M)
    mask = row_ok[:, None] & col_ok[None, :]
    if splits == 1:
        _epilogue(acc, scale_ptr, bias_ptr, out_ptr, rows, cols, col_ok, mask, stride_om, HAS_SCALE, HAS_BIAS)
    else:
        partials = partial_ptr + rows[:, None] * N + cols[None, :]  # [splits, M, N] fp32
        tl.store(partials + split * M * N, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial is written before the semaphore counts it
        arrived = tl.atomic_add(semaphore_ptr + tile, 1, sem="acq_rel")
        if arrived == splits - 1:  # the last split of this tile: reduce, in split order
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in range(0, splits):
                total += tl.load(partials + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            _epilogue(total, scale_ptr, bias_ptr, out_ptr, rows, cols, col_ok, mask, stride_om, HAS_SCALE, HAS_BIAS)
            tl.atomic_xchg(semaphore_ptr + tile, 0)


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    tile: Tile,
    semaphores: torch.Tensor,
    gated: bool = False,
    programs: int | None = None,
) -> torch.Tensor:
    """x [M, K] (gated: [M, 2K] = [gate | up]) @ (weight [N, K] * scale [N])^T + bias -> [M, N]
    in x's dtype. weight: fp8 e4m3, int8 or x's dtype; scale: fp32 or None (16-bit weights).
    semaphores: the layer's zeroed int32 [SEMAPHORES] (LayerTiles.semaphores), left zeroed;
    `programs`: how many programs to aim for when splitting K (default: the tile's waves a SM)."""
    rows = x.shape[0]
    n, k = weight.shape
    if x.shape[1] != (2 * k if gated else k):
        raise ValueError(f"skinny_linear: input {tuple(x.shape)} for a weight {n} x {k} (gated: {gated})")
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty(rows, n, device=x.device, dtype=x.dtype)
    if rows == 0:
        return out
    tiles = triton.cdiv(rows, tile.block_m) * triton.cdiv(n, tile.block_n)
    if programs is None:
        programs = _INTERPRETER_PROGRAMS if interpreting() else tile.waves * _sm_count(x.device)
    splits, per_split = split_k(tiles, k, tile.block_k, programs)
    if tiles > SEMAPHORES:
        splits, per_split = 1, triton.cdiv(k, tile.block_k) * tile.block_k
    partials = torch.empty(splits, rows, n, device=x.device, dtype=torch.float32) if splits > 1 else out
    _skinny_gemm_kernel[(tiles, splits)](
        x,
        weight,
        weight if scale is None else scale,
        weight if bias is None else bias,
        out,
        partials,
        semaphores,
        rows,
        n,
        k,
        per_split // tile.block_k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        HAS_SCALE=scale is not None,
        HAS_BIAS=bias is not None,
        GATED=gated,
        DOT=tile.dot,
        # Triton 3.9's interpreter computes bf16 tl.dot wrongly: there it multiplies in fp32.
        DOT_FP32=x.dtype == torch.float32 or interpreting(),
        EVEN_K=k % tile.block_k == 0,
        ASM=not interpreting(),
        BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )
    return out


def _sm_count(device: torch.device) -> int:
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _sm_count_of(index: int) -> int:
    """Streaming multiprocessors of a GPU, asked once."""
    return torch.cuda.get_device_properties(index).multi_processor_count
