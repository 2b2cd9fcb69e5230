"""The e4m3 (float8_e4m3fn) format's constants, shared by the fp8 products (fp8.py) and the
Triton kernels that quantize to it (fp8_quant.py)."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
# Floor of a scale: an all-zero row (or token) gets zeros, never 0/0.
MIN_SCALE = 1e-12
