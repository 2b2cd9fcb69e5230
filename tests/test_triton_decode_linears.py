"""Which product the decoder's linear layers run (DecodeLinear, QuantLinear) and that each
path gives the layer's product: the skinny GEMM for decode batches, the torch path past them.

With KIMIAUDIO_KERNELS=triton the kernels run in Triton's interpreter on CPU tensors (compiled
on a GPU). The tile tuner (layers/gemm_tuning.py) times kernels on a GPU: its test is in
tests/test_gpu_gemm_tuning.py.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from kimiaudio.layers import fp8  # noqa: E402
from kimiaudio.layers.decode_linear import DecodeLinear  # noqa: E402
from kimiaudio.layers.gemm_tiles import LARGE, TORCH, bucket_of  # noqa: E402
from kimiaudio.layers.quant_linear import QuantLinear  # noqa: E402
from kimiaudio.layers.triton_support import kernel_mode  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BF16 = dict(atol=5e-2, rtol=2.0**-7)  # fp32 sums, one bf16 rounding


@pytest.fixture
def kernels(monkeypatch):
    """The Triton paths, on the CPU in the interpreter."""
    monkeypatch.setenv("KIMIAUDIO_KERNELS", "triton")
    kernel_mode.cache_clear()
    yield
    monkeypatch.delenv("KIMIAUDIO_KERNELS")
    kernel_mode.cache_clear()


def decode_linear(n_in: int, n_out: int, bias: bool = True, seed: int = 0) -> DecodeLinear:
    torch.manual_seed(seed)
    return DecodeLinear(n_in, n_out, bias=bias).to(device=DEVICE, dtype=torch.bfloat16)


def calls_of(monkeypatch) -> list:
    """Records each skinny GEMM launch (its tile) while letting it run."""
    from kimiaudio.layers import skinny_gemm

    calls, run = [], skinny_gemm.skinny_linear
    monkeypatch.setattr(skinny_gemm, "skinny_linear", lambda *a, **kw: calls.append(a[4]) or run(*a, **kw))
    return calls


def test_decode_rows_take_the_skinny_gemm_and_prefill_rows_cublas(kernels, monkeypatch):
    layer = decode_linear(96, 70)
    calls = calls_of(monkeypatch)
    for rows in (1, 3, 17):
        x = torch.randn(rows, 96, device=DEVICE).bfloat16()
        torch.testing.assert_close(layer(x).float(), F.linear(x, layer.weight, layer.bias).float(), **BF16)
    assert calls == [layer.tiles.tile(1), layer.tiles.tile(3), layer.tiles.tile(17)]
    x = torch.randn(70, 96, device=DEVICE).bfloat16()
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias)) and len(calls) == 3
    layer.tiles.chosen[bucket_of(3)] = TORCH  # a bucket measured faster in cuBLAS
    x = torch.randn(3, 96, device=DEVICE).bfloat16()
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias)) and len(calls) == 3


def test_fp32_layers_stay_torch(kernels, monkeypatch):
    layer = DecodeLinear(96, 70).to(DEVICE)
    calls = calls_of(monkeypatch)
    x = torch.randn(2, 96, device=DEVICE)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias)) and calls == []


def test_gated_down_projection_fuses_silu_and_mul_for_few_rows(kernels, monkeypatch):
    from kimiaudio.layers.activation import silu_and_mul

    layer = decode_linear(80, 70, bias=False)
    calls = calls_of(monkeypatch)
    for rows in (2, 40):  # fused; past GATED_MAX_ROWS its own kernel, then the product
        gate_up = (torch.randn(rows, 160, device=DEVICE) * 3).bfloat16()
        assert torch.equal(layer.forward_gated(gate_up), layer(silu_and_mul(gate_up)))
    assert len(calls) == 4


@pytest.mark.parametrize("scheme", ["fp8", "int8"])
def test_quantized_decode_rows_multiply_unquantized_activations(kernels, scheme):
    # fp8 decode rows on the skinny GEMM are weight-only: the activations stay bf16.
    torch.manual_seed(1)
    layer = QuantLinear.from_linear(torch.nn.Linear(96, 70).bfloat16().to(DEVICE), scheme)
    x = torch.randn(3, 96, device=DEVICE).bfloat16()
    expected = x.double() @ layer.dequantized_weight().double().t() + layer.bias.double()
    torch.testing.assert_close(layer(x).double(), expected, **BF16)
    assert not layer.takes_fp8_rows(3)


def test_int8_prefill_rows_take_the_compute_tile(kernels, monkeypatch):
    torch.manual_seed(2)
    layer = QuantLinear.from_linear(torch.nn.Linear(96, 70).to(DEVICE), "int8")
    calls = calls_of(monkeypatch)
    x = torch.randn(100, 96, device=DEVICE)
    expected = x.double() @ layer.dequantized_weight().double().t() + layer.bias.double()
    torch.testing.assert_close(layer(x).double(), expected, atol=1e-4, rtol=1e-5)
    assert calls == [layer.tiles.tile(100)] and bucket_of(100) == LARGE


def test_fp8_prefill_rows_keep_the_quantized_product(kernels):
    torch.manual_seed(3)
    layer = QuantLinear.from_linear(torch.nn.Linear(96, 70).to(DEVICE), "fp8")
    x = torch.randn(100, 96, device=DEVICE)
    assert torch.equal(layer(x), fp8.fp8_linear(x, layer.qweight, layer.scale, layer.bias))


def test_fp8_decode_rows_may_take_the_quantized_product(kernels):
    """From 5 rows the tuner also times `_scaled_mm` for fp8 (CANDIDATES); a layer that keeps it
    takes its activations quantized (takes_fp8_rows) and multiplies them as prefill rows do."""
    from kimiaudio.layers.gemm_tiles import CANDIDATES

    assert [TORCH in bucket for bucket in CANDIDATES["fp8"]] == [False, False, True, True, True]
    assert [TORCH in bucket for bucket in CANDIDATES["int8"]] == [False] * (LARGE + 1)
    torch.manual_seed(4)
    layer = QuantLinear.from_linear(torch.nn.Linear(96, 70).to(DEVICE), "fp8")
    x = torch.randn(24, 96, device=DEVICE)
    skinny = layer(x)
    layer.tiles.chosen[bucket_of(24)] = TORCH
    assert torch.equal(layer(x), fp8.fp8_linear(x, layer.qweight, layer.scale, layer.bias))
    assert layer.takes_fp8_rows(24) == fp8.hardware_product(x.device, layer.qweight)
    torch.testing.assert_close(layer(x), skinny, atol=0.1, rtol=0.1)  # both near the same product
