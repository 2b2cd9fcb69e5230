"""RMSNorm as Qwen2 (and the official Kimi-Audio code) computes it: in fp32, cast back to the
input dtype before the weight multiply; optionally fused with the residual add before it
(nano-vllm's add-and-norm): the decoder layers carry the residual stream beside the hidden
state, so each add and the norm after it are one Triton kernel on CUDA; before an fp8 GEMM
that kernel also quantizes its output."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kimiaudio.layers.fp8 import Fp8Rows, quantize_activations
from kimiaudio.layers.triton_support import use_triton


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, quantize: bool = False
    ) -> tuple[torch.Tensor | Fp8Rows, torch.Tensor]:
        """x [T, H], residual [T, H] or None -> (norm(x + residual), x + residual) in x's dtype:
        the normed input of the next block and the residual stream it adds to. `quantize`: the
        normed rows quantized to e4m3 (Fp8Rows) for the fp8 GEMM that reads them, in the same
        kernel on CUDA."""
        if use_triton(x.device):
            from kimiaudio.layers import triton_ops

            return triton_ops.rms_norm(x, self.weight, self.eps, residual, quantize)
        out, total = rms_norm_reference(x, self.weight, self.eps, residual)
        return (quantize_activations(out) if quantize else out), total


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch path of RMSNorm.forward (the Triton kernel's reference)."""
    if residual is not None:
        x = x + residual
    # F.rms_norm is the official x * rsqrt(mean(x^2) + eps) in one op (bit-identical on the
    # CPU, checked in fp32 and bf16; one fused kernel on CUDA instead of five launches).
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype), x
