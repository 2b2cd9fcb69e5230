"""8-bit linear layers (layers/quant_linear.py, fp8.py, int8.py) against the fp32 product of
their dequantized weights (and, for fp8, their quantized activations).

fp8 serves through its numerical emulation on the CPU (the same quantized operands multiplied
exactly) and through `torch._scaled_mm` on a CUDA GPU of compute capability 8.9 or higher; the
very `_scaled_mm` call the GPU makes is also checked on the CPU, where torch implements it. The
skinny GEMM that multiplies 8-bit weights on CUDA has its own tests (test_triton_skinny_gemm.py,
test_triton_decode_linears.py).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kimiaudio.layers import fp8
from kimiaudio.layers.quant_linear import QuantLinear, quantize_linears

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
FP32 = dict(atol=1e-5, rtol=1e-5)  # fp32 rounding of sums of ~100 products of size ~1


def linear(n_in, n_out, bias=True, seed=0, dtype=torch.float32, device="cpu"):
    torch.manual_seed(seed)
    layer = nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        layer.weight[3].zero_()  # an all-zero output channel keeps zeros (no 0/0 scale)
        layer.weight[5] *= 40  # a channel far larger than the rest gets its own scale
    return layer.to(device=device, dtype=dtype)


def x_of(rows, cols, dtype=torch.float32, device="cpu", seed=1):
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    x[0] *= 100  # a loud token: per-token activation scales keep the quiet ones precise
    return x.to(device=device, dtype=dtype)


@pytest.mark.parametrize("n_in,n_out", [(64, 48), (60, 50)])
def test_int8_layer_is_the_product_of_its_dequantized_weight(n_in, n_out):
    layer = linear(n_in, n_out)
    q = QuantLinear.from_linear(layer, "int8")
    assert q.qweight.dtype == torch.int8 and q.scale.dtype == torch.float32 and q.scale.shape == (n_out,)
    w = q.dequantized_weight()
    # Round to nearest: no weight moves by more than half its channel's step.
    assert ((w - layer.weight.detach()).abs() <= q.scale[:, None] / 2 + 1e-7).all()
    assert torch.equal(q.qweight[3], torch.zeros(n_in, dtype=torch.int8))
    assert q.qweight[5].abs().max() == 127  # each channel's largest weight maps to 127
    x = x_of(7, n_in).reshape(7, 1, n_in)  # leading dims, as the DiT's [B, N, C]
    torch.testing.assert_close(q(x), x @ w.t() + layer.bias.detach(), **FP32)


def test_int8_bf16_input_widths_the_cpu_kernel_does_not_take():
    # torch 2.13's bf16 _weight_int8pack_mm crashed on a 60-wide input: those dequantize first.
    layer = linear(60, 50, dtype=torch.bfloat16)
    q = QuantLinear.from_linear(layer, "int8")
    x = x_of(4, 60, torch.bfloat16)
    expected = x.float() @ q.dequantized_weight().t() + layer.bias.float()
    torch.testing.assert_close(q(x).float(), expected, atol=0.5, rtol=2e-2)


def test_fp8_layer_is_the_product_of_its_quantized_operands():
    layer = linear(64, 48)
    q = QuantLinear.from_linear(layer, "fp8")
    assert q.qweight.dtype == fp8.FP8 and q.scale.shape == (48,)
    w = q.dequantized_weight()
    # e4m3 keeps 3 mantissa bits: a weight above the subnormals is within 2^-4 of itself.
    normal = layer.weight.detach().abs() > q.scale[:, None] * 2.0**-6
    assert ((w - layer.weight.detach()).abs() <= layer.weight.detach().abs() * 2.0**-4 + 1e-12)[normal].all()
    assert (q.qweight[5].float().abs().max() == fp8.FP8_MAX) and not q.qweight.float().isnan().any()
    x = x_of(7, 64)
    xq, x_scale = fp8.quantize_rows(x)
    assert x_scale.shape == (7,) and torch.equal(xq[0].float().abs().max(), torch.tensor(fp8.FP8_MAX))
    expected = (xq.float() * x_scale[:, None]) @ w.t() + layer.bias.detach()
    torch.testing.assert_close(q(x), expected, **FP32)
    # Per token: the loud first token does not coarsen the others' quantization.
    assert (x_scale[1:] < x_scale[0] / 10).all()


def test_fp8_row_scales_are_a_multiply_by_the_reciprocal():
    """A row's scale is amax x fp32(1/448), not amax / 448: torch on CUDA divides by a Python
    number that way, so the rule gives the same bits on the CPU, on CUDA and in the Triton
    kernel (a division differs from it in the last bit for some rows)."""
    x = torch.randn(4096, 8, generator=torch.Generator().manual_seed(0)) * 100
    _, scale = fp8.quantize_rows(x)
    amax = x.abs().amax(dim=-1)
    assert torch.equal(scale, amax * torch.tensor(1 / 448, dtype=torch.float32))
    assert not torch.equal(scale, amax / 448)  # the two rules do part on these rows


@pytest.mark.parametrize("rows", [1, 5, 64])
def test_fp8_scaled_mm_call_equals_the_exact_product(rows):
    """The call the GPU path makes (layout, scale shapes, output dtype), run by torch's CPU
    _scaled_mm: equal to the exact product of the same operands but for the bf16 output
    rounding. A token 100x louder than the rest and a channel 40x larger than the rest make a
    swapped, transposed or dropped scale show far above that rounding."""
    layer = linear(64, 48)
    q = QuantLinear.from_linear(layer, "fp8")
    x = x_of(rows, 64)
    xq, x_scale = fp8.quantize_rows(x)
    got = fp8.scaled_mm(xq, x_scale, q.qweight, q.scale)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 48)
    exact = (xq.double() @ q.qweight.double().t()) * x_scale.double()[:, None] * q.scale.double()[None, :]
    # fp32 accumulation of 64 exact products, then one bf16 rounding (8 bits of mantissa).
    torch.testing.assert_close(got.double(), exact, rtol=2.0**-8, atol=1e-6 * exact.abs().max().item())
    assert torch.equal(got[:, 3], torch.zeros(rows, dtype=torch.bfloat16))  # the all-zero channel


@pytest.mark.skipif(not (CUDA and fp8.fp8_supported(torch.device("cuda"))), reason="needs a GPU with fp8 (sm_89+)")
def test_fp8_scaled_mm_on_the_gpu_equals_the_emulation():
    layer = linear(256, 128, device="cuda", dtype=torch.bfloat16)
    q = QuantLinear.from_linear(layer, "fp8")
    x = x_of(5, 256, torch.bfloat16, "cuda")
    xq, x_scale = fp8.quantize_rows(x)
    expected = (xq.float() * x_scale[:, None]) @ q.dequantized_weight().t() + layer.bias.float()
    torch.testing.assert_close(q(x).float(), expected, atol=0.5, rtol=1e-2)  # one bf16 rounding of the output


def test_quantize_linears_swaps_every_linear_and_nothing_else():
    model = nn.Sequential(
        nn.Linear(16, 32), nn.LayerNorm(32), nn.Sequential(nn.SiLU(), nn.Linear(32, 16)), nn.Embedding(10, 16)
    )
    quantize_linears(model, "int8")
    assert [type(m).__name__ for m in model.modules()].count("QuantLinear") == 2
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model[1], nn.LayerNorm) and isinstance(model[3], nn.Embedding)
    assert quantize_linears(nn.Linear(4, 4), None).weight.dtype == torch.float32  # bf16: unchanged


def test_fp8_scaled_mm_adds_the_bias_in_its_epilogue():
    # The prefill call: the bf16 bias goes into _scaled_mm (one rounding of product + bias).
    layer = linear(64, 48)
    q = QuantLinear.from_linear(layer, "fp8")
    xq, x_scale = fp8.quantize_rows(x_of(5, 64))
    bias = layer.bias.detach().bfloat16()
    got = fp8.scaled_mm(xq, x_scale, q.qweight, q.scale, bias)
    exact = (xq.double() @ q.qweight.double().t()) * x_scale.double()[:, None] * q.scale.double()[None, :]
    exact = exact + bias.double()
    torch.testing.assert_close(got.double(), exact, rtol=2.0**-8, atol=1e-6 * exact.abs().max().item())
    assert not torch.equal(got, fp8.scaled_mm(xq, x_scale, q.qweight, q.scale))


def test_fp8_layer_takes_rows_quantized_before_it():
    # What the norm and silu-and-mul kernels hand over (Fp8Rows) gives the layer's own product.
    layer = linear(64, 48)
    q = QuantLinear.from_linear(layer, "fp8")
    x = x_of(7, 64)
    assert torch.equal(q(fp8.quantize_activations(x)), q(x))
    assert not q.takes_fp8_rows(1000)  # no `_scaled_mm` on the CPU: nothing to quantize for
