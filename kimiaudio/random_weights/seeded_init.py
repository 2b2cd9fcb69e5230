"""The seeded init every random-weight tensor is drawn with, on any device.

On the CPU in float32 it draws the bytes the demo checkpoint's files hold; on a GPU the same
rules draw full-size weights where they will run (no CPU copy); on the "meta" device it draws
nothing, so the full shapes can be checked without allocating them.
"""

from __future__ import annotations

import math

import torch


class SeededInit:
    """Seeded tensors: weights N(0, 1/sqrt(fan_in)) clipped to [0.02, 0.2], small biases.
    One generator per part (`part`), so changing one part leaves the others' values alone."""

    def __init__(self, seed: int, part: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        self.device, self.dtype = torch.device(device), dtype
        self.gen = (
            None if self.device.type == "meta" else torch.Generator(device=self.device).manual_seed(seed * 1009 + part)
        )

    def normal(self, shape, std: float) -> torch.Tensor:
        return torch.randn(tuple(shape), generator=self.gen, device=self.device, dtype=self.dtype).mul_(std)

    def weight(self, *shape: int, fan_in: int | None = None, gain: float = 1.0) -> torch.Tensor:
        fan = fan_in if fan_in is not None else math.prod(shape[1:])
        return self.normal(shape, gain * min(0.2, max(0.02, fan**-0.5)))

    def bias(self, n: int) -> torch.Tensor:
        return self.normal((n,), 0.02)

    def ones(self, *shape: int) -> torch.Tensor:
        return torch.ones(shape, device=self.device, dtype=self.dtype)

    def zeros(self, *shape: int) -> torch.Tensor:
        return torch.zeros(shape, device=self.device, dtype=self.dtype)

    def fixed(self, values: torch.Tensor) -> torch.Tensor:
        """A copy of a computed (not drawn) tensor, e.g. a position table or a filter, on this
        device (a copy: two parameters never share one storage, in memory or in a saved file)."""
        return values.to(device=self.device, dtype=self.dtype, copy=True)
