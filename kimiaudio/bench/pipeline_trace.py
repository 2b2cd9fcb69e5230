"""`bench --trace DIR`: the first seconds of each pipeline row under torch.profiler.

A row's first seconds are where first audio is made: every session's speech encoded, its
prompt prefilled, its first chunk detokenized, beside the answers already generating. The
profiler records them (CPU operators of every thread; on a GPU the CUDA kernels of every stream
and the runtime calls that launched them) for at most TRACE_SECONDS from the row's start, and
writes them as a gzipped Chrome trace, `DIR/trace-<sessions>.json.gz` (chrome://tracing or
Perfetto open it), for reading offline. A trace past MAX_TRACE_BYTES gzipped (a machine that
lends a GPU may send back files of at most 16 MiB) keeps the device's events and the runtime
calls that launched them and leaves the CPU operators out, and says so.

The row's JSON gets a summary: how long was traced, and per CUDA stream (each worker launches
on its own: the LM, its encoders, the detokenizer) the kernels' busy time (the union of their
intervals), its share of the window, the kernel count and the longest-running kernels; with
every stream together, the share of the window the GPU ran anything. On the CPU the same keys,
of the CPU operators per thread.
"""

from __future__ import annotations

import gzip
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from kimiaudio.bench.step_profile import busy_us

TRACE_SECONDS = 2.0
TOP_KERNELS = 5
MAX_TRACE_BYTES = 12 * 2**20


class RowTrace:
    """The profiler over one row: `start` as the row starts, `stop` when the window ends or the
    row does (whichever is first), then `finish` writes the trace and returns the summary."""

    def __init__(
        self, directory: Path, sessions: int, on_gpu: bool, seconds: float = TRACE_SECONDS, rate: float | None = None
    ):
        """`rate`: the row's Poisson arrivals (sessions a second), named in the file's name."""
        from torch.profiler import ProfilerActivity, profile

        name = f"trace-{sessions}" if rate is None else f"trace-{sessions}-poisson-{rate:g}"
        self.path = directory / f"{name}.json.gz"
        self.seconds = seconds
        self.on_gpu = on_gpu
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        self._profile = profile(activities=activities, experimental_config=_every_thread())
        self._started: float | None = None
        self._window_s = 0.0

    def start(self) -> None:
        self._profile.start()
        self._started = time.perf_counter()

    def stop(self) -> None:
        """End the window (once; a second call does nothing). Its length is read before the
        profiler stops: stopping processes the events recorded, which takes a while."""
        if self._started is None or self._window_s:
            return
        self._window_s = time.perf_counter() - self._started
        self._profile.stop()

    def finish(self) -> dict:
        self.stop()
        with tempfile.TemporaryDirectory() as scratch:
            plain = Path(scratch) / "trace.json"
            self._profile.export_chrome_trace(str(plain))
            trimmed = write_gzipped(plain.read_bytes(), self.path)
        summary = summarize(self._events(), self._window_s, self.on_gpu, str(self.path))
        summary["cpu_operators_written"] = not trimmed
        return summary

    def _events(self) -> list[tuple[int, str, float, float]]:
        """(stream or thread, name, start us, duration us) of every kernel (GPU) or outermost
        CPU operator (CPU)."""
        from torch.autograd import DeviceType

        events = self._profile.events()
        if self.on_gpu:
            chosen = [e for e in events if e.device_type == DeviceType.CUDA]
            where = [e.device_resource_id for e in chosen]  # CUPTI's stream id
        else:
            chosen = [e for e in events if e.device_type == DeviceType.CPU and e.cpu_parent is None]
            where = [e.thread for e in chosen]
        return [(w, e.name, e.time_range.start, e.time_range.elapsed_us()) for w, e in zip(where, chosen)]


def write_gzipped(trace: bytes, path: Path, limit: int = MAX_TRACE_BYTES) -> bool:
    """Write the Chrome trace `trace` gzipped to `path`, without its CPU operators if it would
    be larger than `limit` bytes. -> whether they were left out."""
    data = gzip.compress(trace, compresslevel=6)
    trimmed = len(data) > limit
    if trimmed:
        whole = json.loads(trace)
        whole["traceEvents"] = [e for e in whole.get("traceEvents", []) if e.get("cat") != "cpu_op"]
        data = gzip.compress(json.dumps(whole).encode(), compresslevel=6)
    path.write_bytes(data)
    return trimmed


def _every_thread():
    """The profiler's config for recording the operators of every thread (the workers', not only
    the event loop's that starts it) and, on CUDA, the host's waits on the device; None (its
    default: this thread's operators, every stream's kernels) where this torch lacks them."""
    from torch._C._profiler import _ExperimentalConfig

    try:
        return _ExperimentalConfig(profile_all_threads=True, enable_cuda_sync_events=True)
    except TypeError:
        return None


def summarize(events: list[tuple[int, str, float, float]], window_s: float, on_gpu: bool, path: str) -> dict:
    """The row's trace summary (see the module's docstring) from (stream or thread, name, start
    us, duration us) events."""
    window_us = max(window_s * 1e6, 1e-9)
    by_place: dict[int, list[tuple[str, float, float]]] = defaultdict(list)
    for place, name, start, duration in events:
        by_place[place].append((name, start, duration))
    places: list[dict] = []
    for place, items in by_place.items():
        busy = busy_us([(start, start + duration) for _, start, duration in items])
        per_name: dict[str, float] = defaultdict(float)
        for name, _, duration in items:
            per_name[name] += duration
        top = sorted(per_name.items(), key=lambda kv: -kv[1])[:TOP_KERNELS]
        places.append(
            {
                "id": place,
                "busy_ms": round(busy / 1000, 3),
                "busy_share": round(min(busy / window_us, 1.0), 3),
                "kernels": len(items),
                "top": [{"name": name[:120], "ms": round(us / 1000, 3)} for name, us in top],
            }
        )
    places.sort(key=lambda p: -p["busy_ms"])
    everything = busy_us([(start, start + duration) for _, _, start, duration in events])
    return {
        "file": path,
        "seconds": round(window_s, 3),
        "of": "cuda streams" if on_gpu else "cpu threads (no GPU)",
        "busy_share": round(min(everything / window_us, 1.0), 3) if events else 0.0,
        "places": places,
    }
