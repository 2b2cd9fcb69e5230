"""The interpreter's garbage collections while serving, timed.

A collection holds the interpreter's lock from start to end, so every thread stops for it: the
LM worker between two torch calls, the detokenizer worker, the event loop. What the models'
loading allocated is out of the collector's scans (model_stack.freeze_loaded_objects); what
serving allocates is not, and a slow LM step may be one a collection stopped. `GcPauses` times
every collection of the process (gc.callbacks) into the pipeline's metrics: a histogram for
/metrics, and a running total the LM worker's step records read, so a bench can say which slow
steps a collection ran in.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

from kimiaudio.pipeline.metrics import PipelineMetrics


class GcPauses:
    """Times the process's collections into `metrics` (PipelineMetrics.note_gc_pause) from
    `install` until `remove`."""

    def __init__(self, metrics: PipelineMetrics, clock: Callable[[], float] = time.perf_counter):
        self.metrics, self.clock = metrics, clock
        self._started: float | None = None

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def remove(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        # Runs in whichever thread the collection runs in, holding the interpreter's lock: no
        # other collection can start between a start and its stop.
        # A collection may start at the recursion limit (deeply nested input being parsed, say):
        # the frames this needs are then refused, and the pause goes uncounted rather than
        # raising inside the collector (an unraisable error) in the middle of that work.
        try:
            if phase == "start":
                self._started = self.clock()
                return
            if self._started is None:  # installed during a collection
                return
            seconds, self._started = self.clock() - self._started, None
            self.metrics.note_gc_pause(seconds, full=info.get("generation") == 2)
        except RecursionError:
            self._started = None
