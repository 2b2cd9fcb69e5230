"""When each bench session speaks its first turn: all at once, or as a Poisson process.

`--arrivals burst` (the default): every session commits its first turn at the same moment, the
hardest case for first audio (all their encodes and prefills at once). `--arrivals
poisson:RATE`: sessions arrive as a Poisson process of RATE sessions a second (exponential
gaps, drawn from a fixed seed so that runs compare alike), the first at the start; each
session's later turns follow its previous answer, as in a burst. `poisson:RATE,RATE,...`: a row
for each rate, in one process: the highest rate a GPU sustains in real time (no underruns) found
in one run, the model loaded once.
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

    @classmethod
    def parse_all(cls, text: str) -> list[Arrivals]:
        """`burst`, or `poisson:` one or more rates, comma-separated (a row for each); a clear
        error naming the whole option otherwise."""
        kind, _, rates = text.strip().partition(":")
        try:
            if kind == "poisson" and "," in rates:
                parsed = [cls.parse(f"poisson:{rate}") for rate in rates.split(",")]
                if len({a.rate for a in parsed}) < len(parsed):
                    raise KimiAudioError("a rate twice")
                return parsed
            return [cls.parse(text)]
        except KimiAudioError:
            raise KimiAudioError(
                f"--arrivals {text!r}: expected burst or poisson:RATE[,RATE...] with each RATE > 0 sessions a "
                "second and no rate twice, e.g. poisson:4 or poisson:2,4,8"
            ) from None

    @property
    def name(self) -> str:
        return "burst" if self.rate is None else f"poisson:{self.rate:g}"

    def offsets(self, sessions: int) -> list[float]:
        """Seconds from the row's start at which each session speaks its first turn."""
        if self.rate is None:
            return [0.0] * sessions
        gaps = np.random.default_rng(ARRIVAL_SEED).exponential(1.0 / self.rate, sessions)
        return [0.0, *np.cumsum(gaps[: sessions - 1]).tolist()][:sessions]
