"""FP8 (e4m3) linear products: weights with a scale per output channel, activations quantized
per token, the product through `torch._scaled_mm` with both scales applied to its fp32
accumulator and the bias added in its epilogue.

Activations come quantized (`Fp8Rows`) from the kernel that produced them (RMSNorm,
silu-and-mul: triton_ops.py), or are quantized here in one kernel (fp8_quant.py) on CUDA.
Decode batches (up to 64 rows) do not take this path on CUDA: QuantLinear multiplies them by the
e4m3 weights directly, activations unquantized (skinny_gemm.py).

`_scaled_mm` needs a GPU of compute capability 8.9 or higher (Ada, Hopper) and dimensions that
are multiples of 16. Elsewhere (the CPU, toy shapes) `fp8_linear` computes the same product
numerically: the same quantized operands, multiplied exactly (float64) and scaled the same way. That
emulation is what the CPU tests check and what a tiny checkpoint uses on a GPU; serving in fp8
on a device without fp8 is refused at start (`require_fp8`), since it would be slower than bf16.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kimiaudio.errors import ConfigError
from kimiaudio.layers.e4m3 import FP8, FP8_MAX, INV_FP8_MAX, MIN_SCALE
from kimiaudio.layers.triton_support import use_triton


def fp8_supported(device: torch.device) -> bool:
    """Whether `device` multiplies fp8 in hardware (CUDA, compute capability >= 8.9)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def require_fp8(device: torch.device, key: str) -> None:
    """Refuse fp8 weights where the products would not run in fp8."""
    if fp8_supported(device):
        return
    where = (
        f"{torch.cuda.get_device_name(device)} has compute capability "
        f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}"
        if device.type == "cuda"
        else f"the device is {device.type}"
    )
    raise ConfigError(
        f"{key} = fp8 needs a CUDA GPU of compute capability 8.9 or higher (RTX 4090, L4, L40S, "
        f"H100, H200); {where}: use int8 (or auto)"
    )


class Fp8Rows(NamedTuple):
    """Activation rows quantized per row: x ~ q * scale[:, None], x of `dtype`."""

    q: torch.Tensor  # [T, K] e4m3
    scale: torch.Tensor  # [T] fp32
    dtype: torch.dtype  # the model dtype the rows were computed in (the product's output dtype)

    @property
    def shape(self) -> torch.Size:
        return self.q.shape


def quantize_activations(x: torch.Tensor) -> Fp8Rows:
    """x [T, K] -> its rows quantized (quantize_rows): one Triton kernel on CUDA."""
    if use_triton(x.device):
        from kimiaudio.layers import fp8_quant

        q, scale = fp8_quant.quantize_rows(x)
    else:
        q, scale = quantize_rows(x)
    return Fp8Rows(q, scale, x.dtype)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, C] -> (e4m3 [R, C], fp32 scale [R]) with x ~ q * scale[:, None]: each row scaled so
    that its largest magnitude maps to 448."""
    scale = (x.abs().amax(dim=-1).float() * INV_FP8_MAX).clamp_min(MIN_SCALE)
    q = (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def scaled_mm(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The hardware product: xq [T, K] e4m3 with x_scale [T], qweight [N, K] e4m3 with scale [N]
    (+ bias [N] bf16, in the epilogue) -> bf16 [T, N]. Row-wise scaling takes fp32 scales shaped
    [T, 1] and [1, N]; the weight goes in column-major, as cuBLASLt wants it (a transposed view,
    no copy). torch runs the same call on the CPU, where the tests check its layout, scales and
    bias against the exact product."""
    return torch._scaled_mm(
        xq, qweight.t(), scale_a=x_scale[:, None], scale_b=scale[None, :], bias=bias, out_dtype=torch.bfloat16
    )


def hardware_product(device: torch.device, qweight: torch.Tensor) -> bool:
    """Whether `_scaled_mm` multiplies this weight on `device` (else: the emulation)."""
    n, k = qweight.shape
    return fp8_supported(device) and k % 16 == 0 and n % 16 == 0


def fp8_linear(
    x: torch.Tensor | Fp8Rows, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [T, K] (model dtype, or already quantized) @ (qweight [N, K] e4m3 * scale [N])^T + bias
    -> [T, N] in x's dtype. Each token of x is quantized with its own scale first."""
    rows = x if isinstance(x, Fp8Rows) else quantize_activations(x)
    xq, x_scale = rows.q, rows.scale
    if hardware_product(xq.device, qweight):
        fused = bias is not None and bias.dtype == torch.bfloat16 == rows.dtype  # _scaled_mm takes a bf16 bias
        out = scaled_mm(xq, x_scale, qweight, scale, bias if fused else None).to(rows.dtype)
        return out if bias is None or fused else out + bias
    # In float64 every product of two e4m3 values and every sum of up to 2^15 of them is exact
    # (they span 2^-18 .. 2^33), so a row's result does not depend on how many rows share the
    # matmul or the order it sums in: batched equals batch-1, bit for bit.
    exact = xq.double() @ qweight.double().t()
    out = (exact * x_scale.double()[:, None] * scale.double()[None, :]).to(rows.dtype)
    return out if bias is None else out + bias
