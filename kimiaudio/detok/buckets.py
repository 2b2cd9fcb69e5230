"""Bucket shapes of the batched DiT (no torch): a few fixed (rows, frames, prefix) shapes.

A batch of chunks is padded up to the smallest bucket that holds it: rows to a power of two (up
to max_batch_sessions), the chunk's frames N to the frame counts the chunk schedule produces
(rounded up to FRAME_ALIGN), the cached prefix P to a multiple of PREFIX_STEP (or the K/V cap).
Padding is masked (detok/dit_batch.py), so any bucket gives each row the same result; fixed
shapes let each bucket's ODE step be captured once in a CUDA graph. Without graphs (the CPU)
`exact` buckets are the batch's own shape: the same code, nothing padded.
"""

from __future__ import annotations

from dataclasses import dataclass

from kimiaudio.config.chunk_schedule import ChunkSchedule

FRAME_ALIGN = 16  # frames and keys in multiples of 16: aligned attention masks
PREFIX_STEP = 256  # prefix buckets: masked keys cost little next to the chunk's GEMMs


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


@dataclass(frozen=True)
class BucketShape:
    rows: int  # B
    frames: int  # N: frames of the chunk (carried look-ahead included)
    prefix: int  # P: cached K/V frames of earlier chunks


@dataclass(frozen=True)
class Buckets:
    batch_sizes: tuple[int, ...]
    frame_sizes: tuple[int, ...]
    prefix_sizes: tuple[int, ...]
    exact: bool = False

    @classmethod
    def for_schedule(cls, schedule: ChunkSchedule, max_batch_sessions: int, exact: bool = False) -> Buckets:
        sizes, b = [], 1
        while b < max_batch_sessions:
            sizes.append(b)
            b *= 2
        sizes.append(max_batch_sessions)
        frames = {_round_up(schedule.frames(i), FRAME_ALIGN) for i in range(schedule.num_growing_chunks() + 1)}
        cap = _round_up(schedule.max_kv_cache_frames, FRAME_ALIGN)
        prefixes = [0, *range(PREFIX_STEP, cap, PREFIX_STEP), cap]
        return cls(tuple(sizes), tuple(sorted(frames)), tuple(sorted(set(prefixes))), exact)

    @property
    def max_shape(self) -> BucketShape:
        return BucketShape(self.batch_sizes[-1], self.frame_sizes[-1], self.prefix_sizes[-1])

    def shape(self, rows: int, frames: int, prefix: int) -> BucketShape:
        """The bucket of a batch of `rows` chunks of at most `frames` frames and `prefix` cached
        frames (rows beyond the largest batch size are the caller's to split)."""
        if rows > self.batch_sizes[-1]:
            raise ValueError(f"{rows} rows: batches hold at most {self.batch_sizes[-1]}")
        if self.exact:
            return BucketShape(rows, frames, prefix)
        return BucketShape(
            _pick(self.batch_sizes, rows, 1),
            _pick(self.frame_sizes, frames, FRAME_ALIGN),
            _pick(self.prefix_sizes, prefix, FRAME_ALIGN),
        )

    def serving_shapes(self, stream: list[tuple[int, int]]) -> list[BucketShape]:
        """The buckets to capture before serving, for every batch size: those of a stream's
        (frames, prefix) chunks (detok/chunk_shapes.py), and the longest chunks with any prefix
        (batches mix streams at different points). First chunks run apart (their own steps)."""
        pairs = {(self.shape(1, n, p).frames, self.shape(1, n, p).prefix) for n, p in stream}
        longest = max(n for n, _ in pairs)
        pairs |= {(longest, p) for p in self.prefix_sizes}
        return [BucketShape(b, n, p) for b in self.batch_sizes for n, p in sorted(pairs)]


def _pick(sizes: tuple[int, ...], n: int, align: int) -> int:
    for size in sizes:
        if size >= n:
            return size
    return _round_up(n, align)  # beyond the planned buckets: its own aligned shape
