"""A linear layer whose weight is stored in 8 bits, and the step that swaps one in.

`QuantLinear` holds the quantized weight (`qweight` [out, in], int8 or float8 e4m3), one fp32
scale per output channel (`scale`) and the bias in the model dtype. They are parameters
(frozen), so whatever counts a module's parameters (memory plans, a decode step's bytes read)
counts them at their real size. The forward allocates only its outputs and never reads a value
back to the host, so it runs inside captured CUDA graphs like nn.Linear.

The product, by scheme and device:
- on CUDA (Triton), int8 at any number of rows and fp8 up to 64 rows (a decode step): the
  skinny GEMM, weight-only (skinny_gemm.py: the 8-bit weights widened in registers, the scale
  and bias in its epilogue), with the layer's tile per bucket of rows (decode_linear.py);
- fp8 past 64 rows (prefill): activations quantized per token (fused into the RMSNorm or
  silu-and-mul before, which hand over fp8.Fp8Rows when `takes_fp8_rows`), then `_scaled_mm`;
- elsewhere (the CPU): fp8.fp8_linear's emulation, int8.int8_linear's torch product.
Schemes: "fp8" (weights in e4m3; activations in e4m3 for `_scaled_mm` and the emulation) and
"int8" (weights only); None leaves a module as it is. Quantizing is row-wise, so a fused
projection (q/k/v, gate/up) gets the same scales its parts would have had.
"""

from __future__ import annotations

import torch
from torch import nn

from kimiaudio.layers import fp8, int8
from kimiaudio.layers.activation import silu_and_mul
from kimiaudio.layers.decode_linear import fuses_gate, skinny_product
from kimiaudio.layers.gemm_tiles import MAX_SKINNY_ROWS, TORCH, LayerTiles
from kimiaudio.layers.triton_support import use_triton

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
        self.tiles = LayerTiles(scheme)

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

    def forward(self, x: torch.Tensor | fp8.Fp8Rows) -> torch.Tensor:
        if isinstance(x, fp8.Fp8Rows):
            return fp8.fp8_linear(x, self.qweight, self.scale, self.bias)
        rows = x.reshape(-1, x.shape[-1])  # DiT inputs are [B, N, C]
        out = None
        if self._skinny(rows.shape[0]):
            out = skinny_product(self.tiles, rows, self.qweight, self.scale, self.bias)
        if out is None:
            out = self._linear(rows, self.qweight, self.scale, self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)

    def forward_gated(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2 * in_features] = [gate | up] -> self(silu(gate) * up): silu-and-mul
        fused into the skinny GEMM's loads for a few rows, into the quantization for fp8's
        `_scaled_mm`, else a kernel of its own."""
        rows = gate_up.shape[0]
        if self._skinny(rows) and fuses_gate(self.tiles, rows, gate_up.device):
            out = skinny_product(self.tiles, gate_up, self.qweight, self.scale, self.bias, gated=True)
            if out is not None:
                return out
        return self(silu_and_mul(gate_up, quantize=self.takes_fp8_rows(rows)))

    def takes_fp8_rows(self, rows: int) -> bool:
        """Whether the input of `rows` rows should come quantized (fp8.Fp8Rows from the kernel
        that makes it): fp8 weights that `_scaled_mm` multiplies, at rows the skinny GEMM does
        not take."""
        device = self.qweight.device
        if self.scheme != "fp8" or not fp8.hardware_product(device, self.qweight):
            return False
        return not (self._skinny(rows) and use_triton(device) and self.tiles.tile(rows) != TORCH)

    def _skinny(self, rows: int) -> bool:
        """Whether the skinny GEMM may take `rows` rows (int8: any; fp8: a decode batch)."""
        return self.scheme == "int8" or rows <= MAX_SKINNY_ROWS

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
