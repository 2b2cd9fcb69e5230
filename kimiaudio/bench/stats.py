"""Percentiles as every bench reports them (one definition: numpy's linear interpolation)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np


@overload
def percentile(values: Sequence[float], q: float) -> float | None: ...


@overload
def percentile(values: Sequence[float], q: float, empty: float) -> float: ...


def percentile(values: Sequence[float], q: float, empty: float | None = None) -> float | None:
    """The q-th percentile of `values`; `empty` when there are none (None prints as JSON null)."""
    if len(values) == 0:
        return empty
    return _percentile(values, q)


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def ms_p50_p95(seconds: Sequence[float]) -> tuple[float | None, float | None]:
    """p50 and p95 of durations in seconds, in milliseconds (None, None when there are none)."""
    if len(seconds) == 0:
        return None, None
    return 1000 * _percentile(seconds, 50), 1000 * _percentile(seconds, 95)
