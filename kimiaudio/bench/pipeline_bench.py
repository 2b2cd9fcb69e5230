"""`python -m kimiaudio bench`: throughput and latency of the serving pipeline.

For each concurrency N it runs N synthetic conversations (one or more spoken turns each)
through the real pipeline in this process (no network), then the same turns through the
offline batch-1 reference loop, and prints per N: aggregate and per-session generated
tokens/s, LM step and detokenizer batch times, submit -> first audio chunk p50/p95, per-session
real-time factor, KV blocks used, prefix-cache hit rate, and the speed-up over the reference.
The same seeds are used on both sides, so both generate the same tokens. Every turn runs
to its new-position limit unless `--natural-lengths` (see bench_inputs). Sessions speak their
first turn at once or as a Poisson process (bench/arrivals.py); each row says why its turns
waited (p50 and p95 of each stage of a turn) and why its LM steps were slow (bench/slow_steps.py).
One session's conversation, as its listener hears it, is bench/session_run.py.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kimiaudio.bench.arrivals import Arrivals
from kimiaudio.bench.lm_bench import bench_lm, bench_reference
from kimiaudio.bench.pipeline_trace import RowTrace
from kimiaudio.bench.session_run import STAGES, run_session
from kimiaudio.bench.slow_steps import slow_step_report
from kimiaudio.bench.speech import synthetic_speech
from kimiaudio.bench.stats import percentile
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.pipeline.worker import configure_worker_thread


@dataclass
class BenchRow:
    sessions: int
    turns: int
    generated_tokens: int
    wall_s: float
    tokens_per_s: float
    tokens_per_s_per_session: float
    lm_step_ms_p50: float  # one engine step on the LM worker, measured while the detokenizer runs
    lm_step_ms_p95: float
    detok_ms_p50: float  # one detokenizer batch (every chunk due in it runs in it, together)
    first_audio_ms_p50: float
    first_audio_ms_p95: float
    rtf_p50: float  # per-session generation time / audio seconds produced (< 1: faster than real time)
    stall_ms_p95: float  # per turn: silence a listener playing from the first chunk hears (0 = never ran dry)
    underruns: int  # times a session's playback ran dry after it started, all turns
    guard_actions: int  # chunks the real-time guard ran with fewer ODE steps
    # p50 and p95 per turn of each stage (ms): waiting for the LM worker, encoding, prefill (and
    # queue in the engine), prefill -> first speech code, first code -> first PCM chunk.
    stages_ms_p50: dict
    stages_ms_p95: dict
    slow_lm_steps: dict  # steps above 1.3x the p50, by what they carried (bench/slow_steps.py)
    gc_pauses: dict  # the interpreter's collections during the row (each stops every thread)
    detok_graph_captures: int  # detokenizer CUDA graphs captured during the row (shapes not planned)
    arrivals: str  # burst, or poisson:RATE (sessions a second)
    device_memory_gb: float | None  # in use on the GPU at the end of the run (None on the CPU)
    kv_blocks_used_peak: int
    kv_blocks_total: int
    prefix_cache_hit_rate: float
    # The most the detokenizer's streams and its voice cache held (bytes): the run's share of
    # the two parts the memory plan reserves at their worst case.
    detok_state_peak_bytes: int
    voice_cache_peak_bytes: int
    reference_tokens_per_s: float | None = None  # offline path: encode, reference loop, detokenize
    reference_generated_tokens: int | None = None  # equal to generated_tokens when both sides agree
    speedup_vs_reference: float | None = None
    lm_tokens_per_s: float | None = None  # LM alone: the engine ...
    lm_reference_tokens_per_s: float | None = None  # ... and the batch-1 reference loop
    lm_generated_tokens: int | None = None  # by the engine ...
    lm_reference_generated_tokens: int | None = None  # ... and by the reference loop
    lm_speedup: float | None = None
    trace: dict | None = None  # with --trace: the row's first seconds under the profiler (pipeline_trace.py)


BURST = Arrivals()


def _percentile(values: list[float], q: float) -> float:
    return percentile(values, q, empty=float("nan"))  # the row's fields are floats


async def bench_pipeline(
    stack,
    config,
    n: int,
    inputs: list[list[np.ndarray]],
    params: list[SamplingParams],
    voice_audio: tuple[np.ndarray, np.ndarray] | None = None,
    arrivals: Arrivals = BURST,
    trace_dir: Path | None = None,
) -> BenchRow:
    """`voice_audio` (16 kHz, 24 kHz): every turn speaks in a voice made from it, added (its
    prefix computed) before the clock starts, as a server adds a voice before it is used.
    `arrivals`: when each session speaks its first turn. `trace_dir`: profile the row's first
    seconds into a trace file there (pipeline_trace.py)."""
    pipeline = Pipeline(stack, config)
    await pipeline.start()
    m = pipeline.metrics
    trace = None if trace_dir is None else RowTrace(trace_dir, n, stack.device.type == "cuda", rate=arrivals.rate)
    window_end = None
    try:
        voice = await pipeline.make_voice("bench", *voice_audio) if voice_audio is not None else None
        sr_out, offsets = stack.detokenizer.sample_rate, arrivals.offsets(n)
        if trace is not None:
            trace.start()
            window_end = asyncio.get_running_loop().call_later(trace.seconds, trace.stop)
        start = time.perf_counter()
        results = await asyncio.gather(
            *[run_session(pipeline, inputs[i], params[i], sr_out, voice, offsets[i]) for i in range(n)]
        )
        wall = time.perf_counter() - start
        s = pipeline.stats()
    finally:
        if window_end is not None:
            window_end.cancel()
        if trace is not None:
            trace.stop()  # the row ended within the window (or failed)
        await pipeline.stop()
    tokens = sum(r["tokens"] for r in results)
    first = [x for r in results for x in r["first_audio"]]
    rtf = [x for r in results for x in r["rtf"]]
    stalls = [x for r in results for x in r["stall"]]
    pauses = m.gc_pause_s.recent_values()
    gc_pauses = {
        "count": len(pauses),
        "full": m.gc_full_pauses,
        "total_ms": round(1000 * sum(pauses), 3),
        "max_ms": round(1000 * max(pauses, default=0.0), 3),
    }
    per_stage = {stage: [x for r in results for x in r["stages"][stage]] for stage in STAGES}
    stages = {q: {stage: round(1000 * _percentile(v, q), 2) for stage, v in per_stage.items()} for q in (50, 95)}
    memory = None
    if stack.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(stack.device)
        memory = (total - free) / 1e9
    cached, computed = s["prefill_tokens_cached"], s["prefill_tokens_computed"]
    return BenchRow(
        sessions=n,
        turns=len(inputs[0]),
        generated_tokens=tokens,
        wall_s=wall,
        tokens_per_s=tokens / wall,
        tokens_per_s_per_session=tokens / wall / n,
        lm_step_ms_p50=1000 * _percentile(m.lm_step_s.recent_values(), 50),
        lm_step_ms_p95=1000 * _percentile(m.lm_step_s.recent_values(), 95),
        detok_ms_p50=1000 * _percentile(m.detok_batch_s.recent_values(), 50),
        first_audio_ms_p50=1000 * _percentile(first, 50),
        first_audio_ms_p95=1000 * _percentile(first, 95),
        rtf_p50=_percentile(rtf, 50),
        stall_ms_p95=1000 * _percentile(stalls, 95),
        underruns=sum(r["underruns"] for r in results),
        guard_actions=m.detok_guard_actions,
        stages_ms_p50=stages[50],
        stages_ms_p95=stages[95],
        slow_lm_steps=slow_step_report(m.recent_steps()),
        gc_pauses=gc_pauses,
        detok_graph_captures=m.detok_graph_captures,
        arrivals=arrivals.name,
        device_memory_gb=memory,
        kv_blocks_used_peak=s["kv_blocks_total"]
        - (m.min_free_blocks if m.min_free_blocks is not None else s["kv_blocks_total"]),
        kv_blocks_total=s["kv_blocks_total"],
        prefix_cache_hit_rate=cached / max(cached + computed, 1),
        detok_state_peak_bytes=m.detok_state_peak_bytes,
        voice_cache_peak_bytes=m.voice_cache_peak_bytes,
        trace=None if trace is None else trace.finish(),
    )


@contextmanager
def _torch_threads(device, threads: int):
    """The worker thread's CPU thread count (engine.cpu_threads) for this thread's work too,
    so both sides of a comparison run with the same setting."""
    previous = torch.get_num_threads()
    configure_worker_thread(device, threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def warm_up(stack, config, reference: bool) -> None:
    """One short untimed conversation through every timed path, so that lazy initialisation
    (allocator growth, kernel selection) does not land in the first row."""
    inputs = [[synthetic_speech(1.5, seed=99)]]
    params = [SamplingParams.from_config(config.sampling, seed=99, max_new_tokens=16)]
    asyncio.run(bench_pipeline(stack, config, 1, inputs, params))
    if reference:
        with _torch_threads(stack.device, config.engine.cpu_threads):
            bench_reference(stack, inputs, params)
            bench_lm(stack, config, inputs, params, repeats=1)


def bench_inputs(
    config, n: int, turns: int, max_new_tokens: int, speech: list[np.ndarray] | None, fixed_length: bool = True
):
    """Per session its turns' audio and sampling params (fixed seeds: runs compare alike).

    fixed_length: every turn runs to `max_new_tokens` past its stop tokens (`ignore_eos`, as
    vLLM's throughput benchmark), so every step runs all N sessions and the LM step's spread
    shows what disturbs it (the detokenizer, prefills) rather than the batch draining as
    replies end one by one; False: each reply ends where the model stops it."""
    inputs = [
        [
            speech[(i + k) % len(speech)] if speech else synthetic_speech(2.0 + (i + k) % 3, seed=i * 31 + k)
            for k in range(turns)
        ]
        for i in range(n)
    ]
    # Fixed per-session seeds on both sides: the same tokens, run after run.
    params = [
        SamplingParams.from_config(
            config.sampling, seed=1000 + i, max_new_tokens=max_new_tokens, ignore_eos=fixed_length
        )
        for i in range(n)
    ]
    return inputs, params


def run_bench(
    stack,
    config,
    sessions: list[int],
    turns: int,
    max_new_tokens: int,
    speech: list[np.ndarray] | None = None,
    reference: bool = True,
    progress: bool = True,
    fixed_length: bool = True,
    arrivals: list[Arrivals] | None = None,
    trace_dir: Path | None = None,
) -> list[BenchRow]:
    """A row for each session count, and for each of `arrivals` (default: a burst) at it."""
    arrivals = arrivals or [BURST]
    rows = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(sessions) * (len(arrivals) + (1 if reference else 0)), desc="bench", unit="run")
    warm_up(stack, config, reference)
    for n in sessions:
        inputs, params = bench_inputs(config, n, turns, max_new_tokens, speech, fixed_length)
        rows_n = []
        for a in arrivals:
            timed = bench_pipeline(stack, config, n, inputs, params, arrivals=a, trace_dir=trace_dir)
            rows_n.append(asyncio.run(timed))
            if bar:
                bar.update()
        if reference:
            # Every session, not a sample: replies differ in how much speech each position carries.
            # The same inputs whatever their arrivals: one baseline for the session count's rows.
            with _torch_threads(stack.device, config.engine.cpu_threads):
                reference_tokens, reference_rate = bench_reference(stack, inputs, params)
                lm = bench_lm(stack, config, inputs, params)
            for row in rows_n:
                row.reference_generated_tokens, row.reference_tokens_per_s = reference_tokens, reference_rate
                (
                    row.lm_generated_tokens,
                    row.lm_tokens_per_s,
                    row.lm_reference_generated_tokens,
                    row.lm_reference_tokens_per_s,
                ) = lm
                row.speedup_vs_reference = row.tokens_per_s / row.reference_tokens_per_s
                row.lm_speedup = row.lm_tokens_per_s / row.lm_reference_tokens_per_s
            if bar:
                bar.update()
        rows += rows_n
    if bar:
        bar.close()
    return rows
