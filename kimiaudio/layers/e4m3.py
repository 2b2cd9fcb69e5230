"""The e4m3 (float8_e4m3fn) format's constants, shared by the fp8 products (fp8.py) and the
Triton kernels that quantize to it (fp8_quant.py)."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
# A scale is amax times this (fp32), a multiply, not a divide: torch divides a CUDA tensor by a
# Python number as a multiply by its reciprocal (the CPU divides), so one multiply is the rule
# that gives the same bits on both devices and in the kernels.
INV_FP8_MAX = 1.0 / FP8_MAX
# Floor of a scale: an all-zero row (or token) gets zeros, never 0/0.
MIN_SCALE = 1e-12
