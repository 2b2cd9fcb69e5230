"""`bench --random-weights 7b --profile`: where a decode step's time goes (torch.profiler).

For each batch size, with the engine as served (CUDA graphs on a GPU), PROFILE_STEPS decode
steps run under the profiler. The report a batch size: wall time a step; device-busy time a
step (the union of the kernels' intervals, so kernels overlapping on two streams count once)
and busy / wall, which says whether the step waits on the GPU or the GPU waits on the host;
kernels a step (a replayed CUDA graph's kernels are seen one by one); and the kernels taking
the most time, with their share of the busy time. On the CPU there are no kernels: the same
summary is made of the CPU operators, which keeps the code checked without a GPU.
"""

from __future__ import annotations

import time
from collections import defaultdict

PROFILE_STEPS = 10
WARMUP_STEPS = 3
TOP_KERNELS = 12


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (microseconds)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def summarize(events: list[tuple[str, float, float]], steps: int, wall_s: float, top: int = TOP_KERNELS) -> dict:
    """events (name, start us, duration us) of `steps` steps that took `wall_s` in all."""
    busy = busy_us([(start, start + duration) for _, start, duration in events])
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, _, duration in events:
        by_name[name][0] += 1
        by_name[name][1] += duration
    ranked = sorted(by_name.items(), key=lambda item: -item[1][1])[:top]
    step_ms = 1e3 * wall_s / steps
    busy_ms = busy / 1e3 / steps
    return {
        "steps": steps,
        "wall_ms_per_step": step_ms,
        "busy_ms_per_step": busy_ms,
        "busy_fraction": busy_ms / step_ms if step_ms else 0.0,
        "kernels_per_step": len(events) / steps,
        "top": [
            {
                "name": name[:120],
                "calls_per_step": calls / steps,
                "ms_per_step": total / 1e3 / steps,
                "share_of_busy": total / busy if busy else 0.0,
            }
            for name, (calls, total) in ranked
        ],
    }


def start_decoding(engine, requests: list) -> list:
    """Add `requests` and step until every one of them decodes; their sequence ids."""
    seq_ids = [engine.add_request(r) for r in requests]
    while len(engine.step()) < len(requests):
        pass  # prefill (chunked)
    return seq_ids


def profile_decode(engine, requests: list, steps: int = PROFILE_STEPS) -> dict:
    """Decode `requests` (already built, all of one batch) and profile `steps` steps of them;
    every request is aborted afterwards."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    on_gpu = engine.device.type == "cuda"
    seq_ids = start_decoding(engine, requests)
    for _ in range(WARMUP_STEPS):
        engine.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()  # each ends in one .tolist(): synchronised
        wall = time.perf_counter() - start
    for seq_id in seq_ids:
        engine.abort(seq_id)
    if on_gpu:
        chosen = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    else:  # CPU operators nest: the outermost ones stand for the kernels
        chosen = [e for e in prof.events() if e.device_type == DeviceType.CPU and e.cpu_parent is None]
    events = [(e.name, e.time_range.start, e.time_range.elapsed_us()) for e in chosen]
    return {"device": "cuda kernels" if on_gpu else "cpu operators (no GPU)", **summarize(events, steps, wall)}
