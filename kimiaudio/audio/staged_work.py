"""Work that can pause between its stages, so that one thread can interleave it with other work.

A staged computation is a generator that yields (nothing) after each stage and returns its
result: the speech encoders yield after the log-mel and after each transformer layer, and the
LM worker runs as many stages per loop iteration as fit in about one engine step's time, so a
committed turn's encoding never holds the running answers back for its whole length.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

T = TypeVar("T")
Stages = Generator[None, None, T]


def run_to_end(stages: Stages[T]) -> T:
    """Run every stage now; the result."""
    while True:
        try:
            next(stages)
        except StopIteration as done:
            return done.value
