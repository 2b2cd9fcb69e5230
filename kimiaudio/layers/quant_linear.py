"""A linear layer whose weight is stored in 8 bits, and the step that swaps one in.

`QuantLinear` holds the quantized weight (`qweight` [out, in], int8 or float8 e4m3), one fp32
scale per output channel (`scale`) and the bias in the model dtype; its product is
fp8.fp8_linear's or int8.int8_linear's. They are parameters (frozen), so whatever counts a
module's parameters (memory plans, a decode step's bytes read) counts them at their real size.
The forward allocates only its outputs and never reads a value back to the host, so it runs
inside captured CUDA graphs like nn.Linear.

Schemes: "fp8" (weights and per-token activations in e4m3) and "int8" (weights only); None
leaves a module as it is. Quantizing is row-wise, so a fused projection (q/k/v, gate/up) gets
the same scales its parts would have had.
"""

from __future__ import annotations

import torch
from torch import nn

from kimiaudio.layers import fp8, int8

SCHEMES = ("fp8", "int8")
_QUANTIZE = {"fp8": fp8.quantize_rows, "int8": int8.quantize_rows}
_LINEAR = {"fp8": fp8.fp8_linear, "int8": int8.int8_linear}
# Rows quantized at a time: bounds the fp32 copy made while quantizing (18,944 x 3,584 in fp32
# would be 270 MB at once).
_ROWS_AT_ONCE = 4096


class QuantLinear(nn.Module):
    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, scheme: str):
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"quantization scheme {scheme!r}: expected one of {', '.join(SCHEMES)}")
        self.scheme = scheme
        self.out_features, self.in_features = qweight.shape
        self.qweight = nn.Parameter(qweight, requires_grad=False)
        self.scale = nn.Parameter(scale, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self._linear = _LINEAR[scheme]

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, scheme: str) -> QuantLinear:
        weight = linear.weight
        if weight.is_meta:  # a memory plan: the shapes and dtypes only
            dtype = fp8.FP8 if scheme == "fp8" else torch.int8
            q = torch.empty(weight.shape, dtype=dtype, device="meta")
            scale = torch.empty(weight.shape[0], dtype=torch.float32, device="meta")
        else:
            parts = [_QUANTIZE[scheme](weight[i : i + _ROWS_AT_ONCE]) for i in range(0, weight.shape[0], _ROWS_AT_ONCE)]
            q, scale = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        return cls(q, scale, None if linear.bias is None else linear.bias.detach(), scheme)

    def dequantized_weight(self) -> torch.Tensor:
        """The weight the products use, in fp32 [out, in] (tests compare against it)."""
        return self.qweight.float() * self.scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # DiT inputs are [B, N, C]
        out = self._linear(rows, self.qweight, self.scale, self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme}"


def quantize_linears(module: nn.Module, scheme: str | None) -> nn.Module:
    """Replace every nn.Linear inside `module` by a QuantLinear of `scheme` (None: unchanged),
    one at a time, so the full-precision copy of only one layer is alive besides the rest."""
    if scheme is None:
        return module
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, QuantLinear.from_linear(child, scheme))
    return module
