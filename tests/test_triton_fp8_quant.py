"""Per-row e4m3 quantization in Triton (layers/fp8_quant.py, and fused into triton_ops.rms_norm
and triton_ops.silu_and_mul) against fp8.quantize_rows, bit for bit.

Compiled on a GPU; in Triton's interpreter on CPU tensors without one. The rows hold every
e4m3 value and every midpoint between two neighbours (ties round to the even one), subnormals,
zeros and a row of zeros (scale 1e-12), at widths that are not multiples of the kernels' blocks.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from kimiaudio.layers import fp8, fp8_quant, triton_ops  # noqa: E402
from kimiaudio.layers.norm import rms_norm_reference  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def every_rounding_case() -> torch.Tensor:
    """A row whose largest magnitude is 448 (scale 1: values quantize as they are): every
    finite e4m3 value, the midpoints between neighbours, and points a quarter step off them."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values = codes.view(fp8.FP8).float()
    values = values[values.isfinite()].unique()  # -448 .. 448, ascending
    mids = (values[1:] + values[:-1]) / 2
    quarters = torch.cat([values[:-1] + (values[1:] - values[:-1]) / 4, values[1:] - (values[1:] - values[:-1]) / 4])
    return torch.cat([values, mids, quarters])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_rows_equals_torch(dtype):
    cases = every_rounding_case()
    x = torch.randn(5, cases.numel(), generator=torch.Generator().manual_seed(0))
    x[0] = cases
    x[1] *= 1000  # a loud row
    x[2] *= 1e-6  # a quiet one: its own scale keeps it precise
    x[3] = 0  # all zeros: the floor of the scale
    x[4, ::7] = 0
    x = x.to(dtype).to(DEVICE)
    q, scale = fp8_quant.quantize_rows(x)
    expected_q, expected_scale = fp8.quantize_rows(x)
    assert torch.equal(scale, expected_scale)
    assert torch.equal(q.view(torch.uint8), expected_q.view(torch.uint8))


@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_quantizes_its_output(residual):
    hidden = 1500  # not a power of two: the kernel's block is wider than the row
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, hidden, generator=gen).bfloat16().to(DEVICE)
    res = torch.randn(4, hidden, generator=gen).bfloat16().to(DEVICE) if residual else None
    weight = (torch.rand(hidden, generator=gen) + 0.5).bfloat16().to(DEVICE)
    rows, total = triton_ops.rms_norm(x, weight, 1e-6, res, quantize=True)
    plain, plain_total = triton_ops.rms_norm(x, weight, 1e-6, res)
    assert isinstance(rows, fp8.Fp8Rows) and rows.dtype == torch.bfloat16 and rows.shape == x.shape
    assert torch.equal(total, plain_total)
    q, scale = fp8.quantize_rows(plain)  # the kernel's own bf16 output, quantized by torch
    assert torch.equal(rows.scale, scale) and torch.equal(rows.q.view(torch.uint8), q.view(torch.uint8))
    reference, _ = rms_norm_reference(x, weight, 1e-6, res)
    torch.testing.assert_close(rows.q.float() * rows.scale[:, None], reference.float(), rtol=2.0**-3, atol=1e-3)


def test_silu_and_mul_quantizes_its_output():
    width = 2500  # spans three of the kernel's 1024-wide blocks, the last one part-full
    gate_up = (torch.randn(3, 2 * width, generator=torch.Generator().manual_seed(2)) * 4).bfloat16().to(DEVICE)
    gate_up[1] = 0  # a zero row
    rows = triton_ops.silu_and_mul(gate_up, quantize=True)
    q, scale = fp8.quantize_rows(triton_ops.silu_and_mul(gate_up))
    assert torch.equal(rows.scale, scale) and torch.equal(rows.q.view(torch.uint8), q.view(torch.uint8))
