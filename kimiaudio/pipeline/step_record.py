"""What each LM engine step carried, so that a slow step can be explained (the benches' tags).

The LM worker brackets every engine step with `StepRecorder.begin` and `end`; the record
(LmStepRecord) says how many sequences decoded in it, how many prompt positions it computed
(a prefill chunk), how many encoder stages the worker ran just before it and whether an
encoder batch was still running on the device (CUDA) during it, whether a detokenizer batch
ran beside it (the two workers share the GPU), whether the detokenizer began capturing a CUDA
graph during it (a shape not captured at start-up), how long the interpreter's garbage
collections ran during it (they stop every thread: pipeline/gc_pauses.py), and whether it was the
first step of its shape (decoding sequences, prefill positions): a shape met for the first time
may build kernels or plans. Everything is read from public counters: the engine's stats, and
what the other threads count in the shared metrics (`Beside`). It also says how much of the step the host spent blocked
on the device's samples (`device_wait_s`): a slow step that waited most of its time was slow on
the device (work beside it on the GPU), one that did not was slow on the host; and how much of
it the LM worker's thread ran on a CPU (`cpu_s`, its thread CPU time): the rest of a host-slow
step (`blocked_s`) it waited for the interpreter's lock while other threads ran Python (or for a
core).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

from kimiaudio.errors import KimiAudioError

NUM_SHAPES_KEPT = 4096  # step shapes remembered for the "new shape" tag
# What a step may carry besides its decodes, in the order the benches list them.
STEP_TAGS = ("prefill", "encode", "detok", "capture", "gc", "new_shape")


class Beside(NamedTuple):
    """The counters of what ran beside the LM worker, read before and after each step
    (PipelineMetrics.beside)."""

    detok_started: int  # detokenizer batches begun
    detok_ended: int  # ... and ended
    graph_captures: int  # detokenizer CUDA graph captures begun
    gc_paused_s: float  # seconds of garbage collection, all threads


@dataclass(frozen=True)
class LmStepRecord:
    seconds: float
    num_decoding: int  # sequences that decoded one position
    prefill_tokens: int  # prompt positions computed (a prefill chunk; 0 = a decode-only step)
    encode_stages: int  # encoder stages the LM worker ran just before the step
    encode_on_device: bool  # an encoder batch was running on the device (CUDA: its own stream)
    detok_overlap: bool  # a detokenizer batch ran during the step
    new_shape: bool  # the first step with these (num_decoding, prefill_tokens)
    device_wait_s: float = 0.0  # of `seconds`, blocked reading the device's samples
    cpu_s: float = 0.0  # of `seconds`, the LM worker's thread running on a CPU (its CPU time)
    graph_capture: bool = False  # the detokenizer began capturing a CUDA graph during the step
    gc_s: float = 0.0  # garbage collection ended during the step (any thread's: all stop for it)

    @property
    def blocked_s(self) -> float:
        """Of `seconds`, neither running nor waiting for the device: waiting for the
        interpreter's lock (or a core). A lower bound where the device wait spins on a core
        (CUDA's default with spare cores), since that wait is then CPU time too."""
        return max(0.0, self.seconds - self.cpu_s - self.device_wait_s)

    @property
    def tags(self) -> list[str]:
        """Names of what the step carried besides its decodes (the bench's slow-step tags)."""
        carried = {
            "prefill": self.prefill_tokens > 0,
            "encode": self.encode_stages > 0 or self.encode_on_device,
            "detok": self.detok_overlap,
            "capture": self.graph_capture,
            "gc": self.gc_s > 0,
            "new_shape": self.new_shape,
        }
        return [name for name in STEP_TAGS if carried[name]]


class StepRecorder:
    """Owned by the LM worker: one `begin` / `end` pair per engine step."""

    def __init__(self) -> None:
        self._shapes: set[tuple[int, int]] = set()
        self._order: deque[tuple[int, int]] = deque()  # the same shapes, oldest first (bounded)
        self._begun: tuple[Any, Beside, int, bool] | None = None

    def begin(self, stats, beside: Beside, encode_stages: int, encode_on_device: bool) -> None:
        """Before the step: the engine's stats, what ran beside it so far."""
        self._begun = (stats, beside, encode_stages, encode_on_device)

    def end(self, seconds: float, stats, beside: Beside, cpu_s: float = 0.0) -> LmStepRecord:
        """After the step: its time, the engine's stats, what ran beside it by now, the CPU time
        the worker's thread spent in it."""
        if self._begun is None:
            raise KimiAudioError("StepRecorder.end: the step was not begun")
        before, then, encode_stages, encode_on_device = self._begun
        decoding = stats.num_decode_tokens - before.num_decode_tokens
        prefill = stats.num_prefill_tokens_computed - before.num_prefill_tokens_computed
        return LmStepRecord(
            seconds=seconds,
            num_decoding=decoding,
            prefill_tokens=prefill,
            encode_stages=encode_stages,
            encode_on_device=encode_on_device,
            detok_overlap=then.detok_started > then.detok_ended or beside.detok_started > then.detok_started,
            new_shape=self._is_new((decoding, prefill)),
            device_wait_s=stats.read_wait_s - before.read_wait_s,
            cpu_s=min(cpu_s, seconds),  # the two clocks' granularities differ
            graph_capture=beside.graph_captures > then.graph_captures,
            gc_s=beside.gc_paused_s - then.gc_paused_s,
        )

    def _is_new(self, shape: tuple[int, int]) -> bool:
        if shape in self._shapes:
            return False
        self._shapes.add(shape)
        self._order.append(shape)
        if len(self._order) > NUM_SHAPES_KEPT:
            self._shapes.discard(self._order.popleft())
        return True
