"""When each bench session speaks its first turn: all at once, or as a Poisson process.

`--arrivals burst` (the default): every session commits its first turn at the same moment, the
hardest case for first audio (all their encodes and prefills at once). `--arrivals
poisson:RATE`: sessions arrive as a Poisson process of RATE sessions a second (exponential
gaps, drawn from a fixed seed so that runs compare alike), the first at the start; each
session's later turns follow its previous answer, as in a burst.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kimiaudio.errors import KimiAudioError

ARRIVAL_SEED = 0


@dataclass(frozen=True)
class Arrivals:
    rate: float | None = None  # sessions a second; None: a burst

    @classmethod
    def parse(cls, text: str) -> Arrivals:
        """`burst` or `poisson:RATE`; a clear error for anything else."""
        kind, _, rate = text.strip().partition(":")
        if kind == "burst" and not rate:
            return cls()
        if kind == "poisson":
            try:
                value = float(rate)
            except ValueError:
                value = math.nan
            if math.isfinite(value) and value > 0:
                return cls(value)
        raise KimiAudioError(
            f"--arrivals {text!r}: expected burst or poisson:RATE with RATE > 0 sessions a second, e.g. poisson:4"
        )

    @property
    def name(self) -> str:
        return "burst" if self.rate is None else f"poisson:{self.rate:g}"

    def offsets(self, sessions: int) -> list[float]:
        """Seconds from the row's start at which each session speaks its first turn."""
        if self.rate is None:
            return [0.0] * sessions
        gaps = np.random.default_rng(ARRIVAL_SEED).exponential(1.0 / self.rate, sessions)
        return [0.0, *np.cumsum(gaps[: sessions - 1]).tolist()][:sessions]
