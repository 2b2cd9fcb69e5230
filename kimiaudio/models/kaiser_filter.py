"""BigVGAN's anti-aliasing low-pass filter design (a kaiser-windowed sinc).

The official checkpoint stores these filters as buffers, and the model (bigvgan.py) uses the
stored ones; this design is what writes them into random-weight checkpoints, so they equal
the ones the official code computes.
"""

from __future__ import annotations

import math

import torch


def kaiser_sinc_lowpass(cutoff: float, half_width: float, taps: int) -> torch.Tensor:
    """BigVGAN's anti-aliasing low-pass filter [1, 1, taps]: a kaiser-windowed sinc with the
    window's beta from the Kaiser design formula for a transition band of `half_width`,
    normalised to unit DC gain."""
    half = taps // 2
    attenuation = 2.285 * (half - 1) * math.pi * (4 * half_width) + 7.95
    if attenuation > 50.0:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21.0:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21.0)
    else:
        beta = 0.0
    window = torch.kaiser_window(taps, periodic=False, beta=beta)
    time = torch.arange(-half, half) + 0.5 if taps % 2 == 0 else torch.arange(taps) - half
    kernel = 2 * cutoff * window * torch.sinc(2 * cutoff * time)
    return (kernel / kernel.sum()).view(1, 1, taps)
