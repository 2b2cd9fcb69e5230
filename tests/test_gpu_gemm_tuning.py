"""The skinny GEMM's tile tuner (layers/gemm_tuning.py): it times candidate tiles in captured
CUDA graphs, so it runs only on a GPU (skipped without one)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="the tuner times kernels on a GPU")
BF16 = dict(atol=5e-2, rtol=2.0**-7)  # fp32 sums, one bf16 rounding


def decode_linear(n_in: int, n_out: int, seed: int):
    from kimiaudio.layers.decode_linear import DecodeLinear

    torch.manual_seed(seed)
    return DecodeLinear(n_in, n_out, bias=True).to(device="cuda", dtype=torch.bfloat16)


def test_tuner_keeps_a_measured_tile_per_bucket():
    pytest.importorskip("triton")
    from kimiaudio.layers.gemm_tiles import TORCH, Tile
    from kimiaudio.layers.gemm_tuning import tune_linears

    model = torch.nn.Sequential(*[decode_linear(512, 384, seed=i) for i in range(3)])
    choices = tune_linears(model, [1, 2, 4, 8, 16, 24], torch.bfloat16)
    assert {c.rows for c in choices} == {1, 4, 16, 24}
    assert all(isinstance(c.tile, Tile) or c.tile == TORCH for c in choices)
    assert all(layer.tiles.chosen == model[0].tiles.chosen for layer in model)
    assert tune_linears(model, [1, 2], torch.bfloat16) == []  # chosen already
    x = torch.randn(4, 512, device="cuda").bfloat16()
    torch.testing.assert_close(model[0](x).float(), F.linear(x, model[0].weight, model[0].bias).float(), **BF16)
