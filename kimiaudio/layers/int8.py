"""INT8 weight-only linear products: weights rounded to int8 with a scale per output channel,
activations left in the model dtype; the product is (x @ q^T) * scale (+ bias).

On CUDA QuantLinear runs the skinny GEMM instead (skinny_gemm.py: each int8 weight tile
widened in registers, the scale and bias applied to the fp32 accumulator), so the weights cross
the memory bus at one byte each. Here, the torch products: on the CPU, torch's
`_weight_int8pack_mm` in float32 and float16, and in bfloat16 when the input width is a
multiple of 16 (torch 2.13's CPU kernel crashed on a bf16 input 60 wide); elsewhere (CUDA with
KIMIAUDIO_KERNELS=torch) the weight is dequantized and multiplied (same values, more traffic).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

INT8_MAX = 127.0
MIN_SCALE = 1e-12  # an all-zero row keeps zeros


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (int8 [N, K], fp32 scale [N]), symmetric, round to nearest: w ~ q * scale."""
    scale = (w.abs().amax(dim=-1).float() / INT8_MAX).clamp_min(MIN_SCALE)
    q = torch.round(w.float() / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def _cpu_pack_mm_takes(x: torch.Tensor) -> bool:
    return x.dtype in (torch.float32, torch.float16) or (x.dtype == torch.bfloat16 and x.shape[1] % 16 == 0)


def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [T, K] @ (qweight [N, K] int8 * scale [N] fp32)^T + bias -> [T, N] in x's dtype."""
    if x.device.type == "cpu" and _cpu_pack_mm_takes(x):
        out = torch._weight_int8pack_mm(x.contiguous(), qweight, scale.to(x.dtype))
        return out if bias is None else out + bias
    return F.linear(x, (qweight.float() * scale[:, None]).to(x.dtype), bias)
