"""Per-row e4m3 quantization of activations in Triton: one kernel where torch takes about nine
(abs, amax, casts, divides, clamps), and the pieces the producing kernels (triton_ops.rms_norm,
triton_ops.silu_and_mul) quantize their output with, so that a prefill's fp8 GEMM reads the
activations once, already in 8 bits.

The values are fp8.quantize_rows's exactly: scale = max(amax * fp32(1/448), 1e-12) and q = e4m3
of clamp(x / scale, +-448), the division rounded to nearest (div_rn, as torch's), the cast to
e4m3 rounded to nearest even.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kimiaudio.layers import e4m3
from kimiaudio.layers.triton_support import interpreting

_MAX = tl.constexpr(e4m3.FP8_MAX)
_INV_MAX = tl.constexpr(e4m3.INV_FP8_MAX)
_MIN_SCALE = tl.constexpr(e4m3.MIN_SCALE)


@triton.jit
def fp8_scale(amax):
    """The row scale of a row whose largest magnitude is `amax` (fp32)."""
    return tl.maximum(amax * _INV_MAX, _MIN_SCALE)


@triton.jit
def fp8_values(y, scale, INTERPRETED: tl.constexpr):
    """y (fp32) / scale, clamped to e4m3's range, rounded to e4m3 (nearest, ties to even)."""
    v = tl.clamp(tl.math.div_rn(y, scale), -_MAX, _MAX)
    if INTERPRETED:
        return _e4m3_by_bits(v)
    return v.to(tl.float8e4nv)  # cvt.rn.satfinite: to nearest even


@triton.jit
def _e4m3_by_bits(v):
    """v (fp32, |v| <= 448) rounded to e4m3 with integer operations: Triton 3.9's interpreter
    rounds a float's cast to e4m3 half up, without carrying into the exponent (124.2 -> 64)."""
    bits = v.to(tl.uint32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    # Normal (|v| >= 2^-6): drop 20 of fp32's 23 mantissa bits, to nearest even (the carry may
    # run into the exponent), and rebase the exponent from 127 to 7.
    normal = ((magnitude + 0x7FFFF + ((magnitude >> 20) & 1)) >> 20) - (120 << 3)
    # Subnormal: a multiple of 2^-9, rounded to nearest even by fp32's own addition.
    steps = (tl.abs(v) * 512.0 + 8388608.0) - 8388608.0
    code = tl.where(magnitude < 0x3C800000, steps.to(tl.uint32), normal)  # 0x3C800000 = 2^-6
    return (code | (bits >> 24) & 0x80).to(tl.uint8).to(tl.float8e4nv, bitcast=True)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, stride_x, num_cols, BLOCK: tl.constexpr, INTERPRETED: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    src = x_ptr + row * stride_x
    amax = tl.max(tl.zeros([BLOCK], tl.float32), 0)
    for first in range(0, num_cols, BLOCK):  # pass 1: the row's largest magnitude
        x = tl.load(src + first + cols, mask=first + cols < num_cols, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(x), 0))
    scale = fp8_scale(amax)
    tl.store(scale_ptr + row, scale)
    for first in range(0, num_cols, BLOCK):  # pass 2 (the row again, from L2): the values
        mask = first + cols < num_cols
        x = tl.load(src + first + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(q_ptr + row * num_cols + first + cols, fp8_values(x, scale, INTERPRETED), mask=mask)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, C] -> (e4m3 [R, C], fp32 scale [R]) as fp8.quantize_rows, in one kernel."""
    rows, cols = x.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    q = torch.empty(rows, cols, device=x.device, dtype=e4m3.FP8)
    scale = torch.empty(rows, device=x.device, dtype=torch.float32)
    if rows:
        block = min(4096, triton.next_power_of_2(cols))
        _quantize_rows_kernel[(rows,)](
            x,
            q,
            scale,
            x.stride(0),
            cols,
            BLOCK=block,
            INTERPRETED=interpreting(),
            num_warps=min(8, max(1, block // 512)),
        )
    return q, scale
