"""The Qwen2 MLP's gated activation, silu(gate) * up, over the fused gate/up GEMM's output."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kimiaudio.layers.fp8 import Fp8Rows, quantize_activations
from kimiaudio.layers.triton_support import use_triton


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The torch reference: two ops, each rounding to the dtype as the official code does."""
    return F.silu(gate) * up


def silu_and_mul(gate_up: torch.Tensor, quantize: bool = False) -> torch.Tensor | Fp8Rows:
    """gate_up [T, 2I] = [gate | up] -> silu(gate) * up [T, I] (one Triton kernel on CUDA);
    `quantize`: quantized per row to e4m3 (Fp8Rows) for the fp8 GEMM after it, in that kernel."""
    if use_triton(gate_up.device):
        from kimiaudio.layers import triton_ops

        return triton_ops.silu_and_mul(gate_up, quantize)
    out = silu_mul(*gate_up.chunk(2, dim=-1))
    return quantize_activations(out) if quantize else out
