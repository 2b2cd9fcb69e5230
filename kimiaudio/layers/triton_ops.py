"""Triton kernels of the decoder layer's elementwise work: one launch where torch takes 2-12.

Imported only once a kernel is chosen (triton_support.use_triton); the torch code beside
each dispatcher (norm.py, rotary.py, activation.py) is the reference. Each kernel rounds to
the model dtype where the official bf16 code's separate torch ops round, so that in bf16 it
gives the official values (up to the last bit of fp32 intermediates) and in fp32 the same:
- `rms_norm`: optional residual add (rounded), then x * rsqrt(mean(x^2) + eps) in fp32,
  rounded, times the weight: one kernel per row instead of add + 4;
- `rotary`: q and k of every token rotated in one launch (x * cos + rotate_half(x) * sin,
  each product rounded) instead of 5 ops per tensor;
- `silu_and_mul`: silu(gate) rounded, times up, from the fused gate/up GEMM's output.
`rms_norm` and `silu_and_mul` can write their output quantized to e4m3 per row instead
(fp8.Fp8Rows, the values of fp8.quantize_rows of the output), for an fp8 GEMM after them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kimiaudio.layers.fp8 import FP8, Fp8Rows
from kimiaudio.layers.fp8_quant import fp8_scale, fp8_values
from kimiaudio.layers.triton_support import interpreting


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    sum_ptr,
    scale_ptr,
    stride_x,
    stride_r,
    num_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    QUANTIZE: tl.constexpr,
    INTERPRETED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < num_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * num_cols + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt_rn(tl.sum(xf * xf, 0) / num_cols + eps)
    y = (xf * inv_rms).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if QUANTIZE:  # the normed row as the model rounds it; all here: its scale needs no second pass
        out = (w * y).to(x_ptr.dtype.element_ty).to(tl.float32)
        scale = fp8_scale(tl.max(tl.abs(out), 0))
        tl.store(scale_ptr + row, scale)
        tl.store(out_ptr + row * num_cols + cols, fp8_values(out, scale, INTERPRETED), mask=mask)
    else:
        tl.store(out_ptr + row * num_cols + cols, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None, quantize: bool = False
) -> tuple[torch.Tensor | Fp8Rows, torch.Tensor]:
    """x, residual [T, H] (rows contiguous) -> (norm(x + residual) * weight, x + residual); the
    first quantized per row (Fp8Rows) with `quantize`."""
    rows, cols = x.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    if quantize and weight.dtype != x.dtype:
        raise ValueError(f"rms_norm: a {weight.dtype} weight for {x.dtype} rows to quantize: expected one dtype")
    out = torch.empty(x.shape, device=x.device, dtype=FP8 if quantize else torch.promote_types(x.dtype, weight.dtype))
    scale = torch.empty(rows, device=x.device, dtype=torch.float32) if quantize else out
    total = torch.empty_like(x) if residual is not None else x
    if rows:
        block = triton.next_power_of_2(cols)
        _rms_norm_kernel[(rows,)](
            x,
            x if residual is None else residual,
            weight,
            out,
            total,
            scale,
            x.stride(0),
            0 if residual is None else residual.stride(0),
            cols,
            eps,
            HAS_RESIDUAL=residual is not None,
            QUANTIZE=quantize,
            INTERPRETED=interpreting(),
            BLOCK=block,
            num_warps=min(16, max(1, block // 256)),
        )
    return (Fp8Rows(out, scale, x.dtype) if quantize else out), total


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_out_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cos,
    stride_sin,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)  # q heads, then k heads
    d = tl.arange(0, HEAD_DIM)
    if head < NUM_Q_HEADS:
        src = q_ptr + token * stride_qt + head * stride_qh
        dst = q_out_ptr + (token * NUM_Q_HEADS + head) * HEAD_DIM
    else:
        src = k_ptr + token * stride_kt + (head - NUM_Q_HEADS) * stride_kh
        dst = k_out_ptr + (token * NUM_KV_HEADS + head - NUM_Q_HEADS) * HEAD_DIM
    tl.store(dst + d, rotated_head(src, cos_ptr + token * stride_cos, sin_ptr + token * stride_sin, HEAD_DIM))


@triton.jit
def rotated_head(src, cos_row, sin_row, HEAD_DIM: tl.constexpr):
    """The head vector at src [D] rotated: x * cos + rotate_half(x) * sin, each product rounded
    to x's dtype as the official ops round them."""
    d = tl.arange(0, HEAD_DIM)
    partner = (d + HEAD_DIM // 2) % HEAD_DIM
    sign = tl.where(d < HEAD_DIM // 2, -1.0, 1.0)  # rotate_half: [-x2, x1]
    dtype = src.dtype.element_ty
    x = tl.load(src + d).to(tl.float32)
    rotated = tl.load(src + partner).to(tl.float32) * sign
    cos = tl.load(cos_row + d).to(tl.float32)
    sin = tl.load(sin_row + d).to(tl.float32)
    return ((x * cos).to(dtype).to(tl.float32) + (rotated * sin).to(dtype).to(tl.float32)).to(dtype)


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hkv, D] (any row strides), cos/sin [T, 1, D] -> new contiguous q, k."""
    tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        q, k = q.contiguous(), k.contiguous()
    q_out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    k_out = torch.empty(k.shape, device=k.device, dtype=k.dtype)
    if tokens:
        _rotary_kernel[(tokens, num_heads + num_kv_heads)](
            q,
            k,
            cos,
            sin,
            q_out,
            k_out,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            cos.stride(0),
            sin.stride(0),
            NUM_Q_HEADS=num_heads,
            NUM_KV_HEADS=num_kv_heads,
            HEAD_DIM=head_dim,
            num_warps=1,
        )
    return q_out, k_out


@triton.jit
def silu_mul(gate_ptrs, mask, half):
    """silu(gate) * up of the [gate | up] elements at gate_ptrs (up `half` elements on): silu
    rounded to the dtype, then the product, as the official two ops."""
    dtype = gate_ptrs.dtype.element_ty
    gate = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_ptrs + half, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (silu * up).to(dtype)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    scale_ptr,
    stride_x,
    num_cols,
    BLOCK: tl.constexpr,
    QUANTIZE: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    row = tl.program_id(0)
    src = x_ptr + row * stride_x
    dst = out_ptr + row * num_cols
    if QUANTIZE:  # one program a row: its scale needs the whole row first
        amax = tl.max(tl.zeros([BLOCK], tl.float32), 0)
        for first in range(0, num_cols, BLOCK):
            cols = first + tl.arange(0, BLOCK)
            y = silu_mul(src + cols, cols < num_cols, num_cols).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(y), 0))
        scale = fp8_scale(amax)
        tl.store(scale_ptr + row, scale)
        for first in range(0, num_cols, BLOCK):  # the row again (from L2), quantized
            cols = first + tl.arange(0, BLOCK)
            y = silu_mul(src + cols, cols < num_cols, num_cols).to(tl.float32)
            tl.store(dst + cols, fp8_values(y, scale, INTERPRETED), mask=cols < num_cols)
    else:
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + cols, silu_mul(src + cols, cols < num_cols, num_cols), mask=cols < num_cols)


def silu_and_mul(x: torch.Tensor, quantize: bool = False) -> torch.Tensor | Fp8Rows:
    """x [T, 2I] = [gate | up] -> silu(gate) * up [T, I]; quantized per row with `quantize`."""
    rows, cols = x.shape[0], x.shape[1] // 2
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty(rows, cols, device=x.device, dtype=FP8 if quantize else x.dtype)
    scale = torch.empty(rows, device=x.device, dtype=torch.float32) if quantize else out
    if rows:
        block = 1024
        _silu_and_mul_kernel[(rows, 1 if quantize else triton.cdiv(cols, block))](
            x, out, scale, x.stride(0), cols, BLOCK=block, QUANTIZE=quantize, INTERPRETED=interpreting(), num_warps=4
        )
    return Fp8Rows(out, scale, x.dtype) if quantize else out
