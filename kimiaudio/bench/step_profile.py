"""`bench --random-weights 7b --profile`: where a decode step's time goes (torch.profiler).

For each batch size, with the engine as served (CUDA graphs on a GPU), PROFILE_STEPS decode
steps run under the profiler. The report a batch size: wall time a step; device-busy time a
step (the union of the kernels' intervals, so kernels overlapping on two streams count once)
and busy / wall, which says whether the step waits on the GPU or the GPU waits on the host;
kernels a step (a replayed CUDA graph's kernels are seen one by one); and the kernels taking
the most time, with their share of the busy time. On the CPU there are no kernels: the same
summary is made of the CPU operators, which keeps the code checked without a GPU.

The kernels are also grouped by what they do (`KERNEL_GROUPS`, by name): the GEMMs, attention
(with the KV store), norms, the layer's elementwise kernels (rotary, silu, quantization), the
sampler and the rest, each in ms a step, beside the idle time (wall less busy). With the bytes
of weights a step reads, the GEMMs' achieved bandwidth: those bytes over the GEMM kernels' time
(all of it, split-K reductions and activation quantization excluded), to set beside the copy
bandwidth: how close the GEMMs run to the floor, apart from what else the step does.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict

PROFILE_STEPS = 10
WARMUP_STEPS = 3
TOP_KERNELS = 12
# First match wins; case-insensitive, over CUDA kernel names and (on the CPU) aten operators.
# cuBLAS names its GEMMs in several ways: nvjet_* are its own kernels from CUDA 12.8 on Hopper
# (most of bf16 decode's linears on an H200 with CUDA 13), xmma/cutlass older ones.
KERNEL_GROUPS = {
    "gemm": r"skinny_gemm|gemm|gemv|nvjet|xmma|cutlass|cublas|splitkreduce|scaled_mm|int8pack"
    r"|aten::(mm|addmm|linear|matmul)",
    "attention": r"decode_partition|merge_partitions|store_kv|rotary_store|attention|fmha|flash",
    "norm": r"rms_norm|layer_norm",
    "rotary_silu_quant": r"rotary|silu|quantize",
    "sampler": r"softmax|topk|sort|scan|cumsum|argmax|gather|multinomial|reduce_kernel|aten::(exp|where|index)",
}


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (microseconds)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def group_of(name: str) -> str:
    return next((group for group, pattern in KERNEL_GROUPS.items() if re.search(pattern, name, re.I)), "other")


def summarize(
    events: list[tuple[str, float, float]],
    steps: int,
    wall_s: float,
    top: int = TOP_KERNELS,
    weight_bytes: int | None = None,
) -> dict:
    """events (name, start us, duration us) of `steps` steps that took `wall_s` in all;
    weight_bytes: what a step's GEMMs read (for their achieved bandwidth)."""
    busy = busy_us([(start, start + duration) for _, start, duration in events])
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, _, duration in events:
        by_name[name][0] += 1
        by_name[name][1] += duration
    ranked = sorted(by_name.items(), key=lambda item: -item[1][1])[:top]
    step_ms = 1e3 * wall_s / steps
    busy_ms = busy / 1e3 / steps
    groups = dict.fromkeys([*KERNEL_GROUPS, "other"], 0.0)
    for name, (_, total) in by_name.items():
        groups[group_of(name)] += total / 1e3 / steps
    gemm_s = groups["gemm"] / 1e3
    return {
        "steps": steps,
        "wall_ms_per_step": step_ms,
        "busy_ms_per_step": busy_ms,
        "busy_fraction": busy_ms / step_ms if step_ms else 0.0,
        "idle_ms_per_step": max(0.0, step_ms - busy_ms),
        "kernels_per_step": len(events) / steps,
        "groups_ms_per_step": groups,
        "gemm_weight_gb": None if weight_bytes is None else weight_bytes / 1e9,
        "gemm_gb_s": weight_bytes / gemm_s / 1e9 if weight_bytes and gemm_s else None,
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


def groups_line(summary: dict, copy_gb_s: float) -> str:
    """One line of a summary's kernel groups: the GEMMs with their bandwidth, the rest, idle."""
    gemm_gb_s = f"{summary['gemm_gb_s']:.0f} GB/s" if summary["gemm_gb_s"] else "-"
    groups = summary["groups_ms_per_step"]
    return (
        f"gemm {groups['gemm']:.2f} ms ({summary['gemm_weight_gb']:.2f} GB at {gemm_gb_s}; copy {copy_gb_s:.0f} GB/s), "
        + ", ".join(f"{group} {ms:.2f} ms" for group, ms in groups.items() if group != "gemm")
        + f", idle {summary['idle_ms_per_step']:.2f} ms"
    )


def start_decoding(engine, requests: list) -> list:
    """Add `requests` and step until every one of them decodes; their sequence ids."""
    seq_ids = [engine.add_request(r) for r in requests]
    while len(engine.step()) < len(requests):
        pass  # prefill (chunked)
    return seq_ids


def profile_decode(engine, requests: list, steps: int = PROFILE_STEPS, weight_bytes: int | None = None) -> dict:
    """Decode `requests` (already built, all of one batch) and profile `steps` steps of them;
    every request is aborted afterwards. weight_bytes: what a step's GEMMs read."""
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
            engine.step()  # each ends reading a step's samples (overlapped: the one launched before)
        wall = time.perf_counter() - start
    for seq_id in seq_ids:
        engine.abort(seq_id)
    if on_gpu:
        chosen = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    else:  # CPU operators nest: the outermost ones stand for the kernels
        chosen = [e for e in prof.events() if e.device_type == DeviceType.CPU and e.cpu_parent is None]
    events = [(e.name, e.time_range.start, e.time_range.elapsed_us()) for e in chosen]
    summary = summarize(events, steps, wall, weight_bytes=weight_bytes)
    return {"device": "cuda kernels" if on_gpu else "cpu operators (no GPU)", **summary}
