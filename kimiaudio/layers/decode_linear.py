"""A linear layer whose few-row products (a decode step's) run the skinny GEMM on CUDA.

`DecodeLinear` is nn.Linear (same parameters, same names, same product) for the LM's decoder
layers and heads. A decode step reads every weight once, and cuBLAS's GEMV for 1-64 rows left
a tenth of the bandwidth unused and needs a second kernel to reduce its split K; the skinny
GEMM (skinny_gemm.py) reduces in its own launch and adds the bias there. Which tile a bucket
of rows takes, or cuBLAS, is the layer's `tiles` (gemm_tiles.py: the table's default until the
tuner measures). `forward_gated` takes the fused gate/up projection's output and multiplies
silu(gate) * up as it loads it, so the down projection needs no activation kernel before it.

`skinny_product` is the dispatch QuantLinear shares: the Triton product, or None for the torch
path (the CPU, KIMIAUDIO_KERNELS=torch, a bucket that measured faster in cuBLAS).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kimiaudio.layers.activation import silu_and_mul
from kimiaudio.layers.gemm_tiles import TORCH, LayerTiles, Tile
from kimiaudio.layers.triton_support import use_triton

SIXTEEN_BIT = (torch.bfloat16, torch.float16)
# Rows up to which the down projection multiplies silu(gate) * up as it loads it: each
# program recomputes it for its rows, so past a few rows one separate kernel costs less.
GATED_MAX_ROWS = 16


def skinny_product(
    tiles: LayerTiles,
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    gated: bool = False,
) -> torch.Tensor | None:
    """x [M, K] (gated: [M, 2K]) @ (weight * scale)^T + bias by the layer's tile for M rows on
    CUDA (or Triton's interpreter when forced) -> [M, N]; None where the torch path runs."""
    rows = x.shape[0]
    if rows == 0 or not use_triton(x.device):
        return None
    tile = tiles.tile(rows)
    if not isinstance(tile, Tile):  # TORCH
        return None
    from kimiaudio.layers.skinny_gemm import skinny_linear

    return skinny_linear(x, weight, scale, bias, tile, tiles.semaphores(x.device), gated=gated)


def fuses_gate(tiles: LayerTiles, rows: int, device: torch.device) -> bool:
    """Whether a down projection of `rows` multiplies silu(gate) * up itself."""
    return 0 < rows <= GATED_MAX_ROWS and use_triton(device) and tiles.tile(rows) != TORCH


class DecodeLinear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.tiles = LayerTiles("bf16")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.dtype in SIXTEEN_BIT:
            out = skinny_product(self.tiles, x, self.weight, None, self.bias)
            if out is not None:
                return out
        return F.linear(x, self.weight, self.bias)

    def forward_gated(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2 * in_features] = [gate | up] -> self(silu(gate) * up)."""
        if gate_up.dtype in SIXTEEN_BIT and fuses_gate(self.tiles, gate_up.shape[0], gate_up.device):
            out = skinny_product(self.tiles, gate_up, self.weight, None, self.bias, gated=True)
            if out is not None:
                return out
        return self(silu_and_mul(gate_up))

    def takes_fp8_rows(self, rows: int) -> bool:
        """Whether the input should come quantized (fp8.Fp8Rows): never, in 16 bits."""
        return False
