"""What the pipeline's workers measure while serving: counters and timing distributions.

Workers record; the server's /metrics, /api/status and the benches read. Each `Timing` keeps
cumulative histogram buckets (for Prometheus: bounded memory however long the server runs)
and a window of the most recent values (for percentiles in the benches). Recording is a few
appends under the GIL, cheap enough for every LM step; readers get a snapshot that may be one
step old.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter, deque

from kimiaudio.pipeline.step_record import Beside, LmStepRecord

# Seconds: from a fraction of a GPU decode step to a stalled multi-second turn.
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    10.0,
)
RECENT = 4096  # values kept for percentiles
# TurnDone.timings keys, in the order a turn passes them (seconds since submit).
TURN_STAGES = (
    "queued_s",
    "encoded_s",
    "prefill_done_s",
    "first_text_s",
    "first_audio_token_s",
    "first_pcm_s",
    "done_s",
)


class Timing:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        self.buckets = buckets
        self.bucket_counts = [0] * (len(buckets) + 1)  # last one: above the largest bound
        self.count = 0
        self.sum = 0.0
        self.recent: deque[float] = deque(maxlen=RECENT)
        # Re-entrant: a garbage collection can start inside a reader's locked section (any
        # allocation may start one), and its callback observes in that same thread (gc_pauses.py).
        self._lock = threading.RLock()

    def observe(self, value: float) -> None:
        with self._lock:
            self.bucket_counts[bisect.bisect_left(self.buckets, value)] += 1
            self.count += 1
            self.sum += value
            self.recent.append(value)

    def reset_recent(self) -> None:
        with self._lock:
            self.recent.clear()

    def recent_values(self) -> list[float]:
        """A copy of the recent values (the benches take their percentiles: bench/stats.py)."""
        with self._lock:
            return list(self.recent)

    def snapshot(self) -> tuple[list[int], int, float]:
        """(per-bucket counts, count, sum), consistent with each other."""
        with self._lock:
            return list(self.bucket_counts), self.count, self.sum


class PipelineMetrics:
    def __init__(self) -> None:
        self.lm_step_s = Timing()  # one engine step (prefill and/or decode of the batch)
        self.lm_batch = Timing(buckets=(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256))  # sequences per step
        # One Whisper + GLM-4 batch, from its first stage to its results on the host (while
        # answers are generated its stages are spread between engine steps).
        self.encode_batch_s = Timing()
        self.detok_batch_s = Timing()  # one detokenizer batch (the chunks run in it)
        # The interpreter's garbage collections (pipeline/gc_pauses.py): each stops every thread.
        self.gc_pause_s = Timing()
        self.gc_paused_s = 0.0  # their running total: a step record's share is its difference
        self.gc_full_pauses = 0  # of them, full (generation 2) collections
        # Detokenizer CUDA graphs captured since start-up: a shape not planned met while serving.
        self.detok_graph_captures = 0
        self.lm_steps: deque[LmStepRecord] = deque(maxlen=RECENT)  # what recent steps carried
        # Detokenizer batches begun and ended (its worker counts, the LM worker reads: a step
        # during which a batch ran shares the GPU with it).
        self.detok_batches_started = 0
        self.detok_batches_ended = 0
        self.detok_chunks = 0  # chunks detokenized
        self.detok_guard_actions = 0  # chunks whose ODE steps the real-time guard lowered
        self.turns: Counter[str] = Counter()  # by final status
        self.turn_stage_s = {stage: Timing() for stage in TURN_STAGES}  # per finished turn
        # By final status: transcriptions, kept out of the answers' figures.
        self.background_turns: Counter[str] = Counter()
        self.min_free_blocks: int | None = None  # KV pool low-water mark since the last reset
        self.max_batch: Counter[str] = Counter()  # largest batch seen per stage: encode, llm, detok
        # The most the detokenizer's streams and its voice cache held at once, after a batch:
        # what a run filled of the two parts the memory plan reserves for their worst case.
        self.detok_state_peak_bytes = 0
        self.voice_cache_peak_bytes = 0

    def note_batch(self, stage: str, size: int) -> None:
        if size > self.max_batch[stage]:
            self.max_batch[stage] = size

    def note_detok_memory(self, state_bytes: int, voice_cache_bytes: int) -> None:
        self.detok_state_peak_bytes = max(self.detok_state_peak_bytes, state_bytes)
        self.voice_cache_peak_bytes = max(self.voice_cache_peak_bytes, voice_cache_bytes)

    def note_gc_pause(self, seconds: float, full: bool) -> None:
        self.gc_pause_s.observe(seconds)
        self.gc_paused_s += seconds
        self.gc_full_pauses += full

    def note_graph_capture(self) -> None:
        self.detok_graph_captures += 1

    def beside(self) -> Beside:
        """What the other threads have counted so far (read around each LM step)."""
        return Beside(self.detok_batches_started, self.detok_batches_ended, self.detok_graph_captures, self.gc_paused_s)

    def note_step(self, record: LmStepRecord) -> None:
        self.lm_steps.append(record)

    def recent_steps(self) -> list[LmStepRecord]:
        """A copy of the recent steps' records (list() of a deque runs under the GIL in one go)."""
        return list(self.lm_steps)

    def note_free_blocks(self, free: int) -> None:
        if self.min_free_blocks is None or free < self.min_free_blocks:
            self.min_free_blocks = free

    def note_turn(self, status: str, timings: dict[str, float], background: bool = False) -> None:
        if background:
            self.background_turns[status] += 1
            return
        self.turns[status] += 1
        for stage, timing in self.turn_stage_s.items():
            if stage in timings:
                timing.observe(timings[stage])

    def reset_recent(self) -> None:
        """Start a new measurement window (the benches call this between rows)."""
        for timing in (
            self.lm_step_s,
            self.lm_batch,
            self.encode_batch_s,
            self.detok_batch_s,
            self.gc_pause_s,
            *self.turn_stage_s.values(),
        ):
            timing.reset_recent()
        self.lm_steps.clear()
        self.min_free_blocks = None
        self.max_batch.clear()
