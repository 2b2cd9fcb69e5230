"""`bench --random-weights 7b`: engine steps with the real Kimi-Audio-7B shapes.

Random bf16 weights in the official config's shapes (docs/official-model.md, "LM config";
random_weights/shapes.py FULL, drawn by random_weights.modules.random_lm on the GPU), no files.
- Decode: for each batch size B it keeps B sequences decoding and times engine steps, with
  CUDA graphs and without (same run, one engine each; graphs only exist on CUDA), and
  compares the step time with the weight-bandwidth floor: the bytes of weights one decode
  step must read (every trunk and MIMO layer plus both heads) over the device's measured
  copy bandwidth. Then a long prompt arrives and the steps that carry its prefill chunks
  beside the B decodes are timed too (mixed steps: what the running streams see).
- Prefill: a 1,000-position prompt with Whisper features at its media positions, alone,
  against its compute floor: its matmul FLOPs over the device's measured matmul FLOP/s.
With `--weights fp8|int8` the same rows are measured twice in one run: with bf16 weights, then
with the decoder layers quantized in place (models/quantize.py), each against its own floor
(the quantized parameters are counted at their stored size: 1 byte a weight plus the scales).
With `--profile`, torch.profiler's account of the steps per batch size (bench/step_profile.py):
the top kernels, the time of each group of kernels (GEMMs, attention, norms, sampler, ...) and
the idle time a step, and the GEMMs' achieved bandwidth (a step's weight bytes over their time).
The skinny GEMM's tiles chosen by measurement at start-up are in the JSON (`gemm_tiles`).
Only the LM is built here; first-audio latency is measured by the pipeline bench. The floors
are measured in roofline.py; the prompts, in the official token numbering, are prompts_7b.py's.
"""

from __future__ import annotations

import gc
import json
import math
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from kimiaudio.bench.prompts_7b import KIMI_AUDIO_7B, PREFILL_LEN, PROMPT_LEN, Prompts
from kimiaudio.bench.roofline import copy_bandwidth, decode_weight_bytes, matmul_flops, prefill_flops
from kimiaudio.bench.stats import percentile
from kimiaudio.bench.step_profile import groups_line, profile_decode, start_decoding
from kimiaudio.config import EngineConfig
from kimiaudio.engine.llm_engine import LLMEngine
from kimiaudio.engine.request import EngineRequest
from kimiaudio.errors import KimiAudioError
from kimiaudio.layers.device_memory import peak_memory
from kimiaudio.layers.fp8 import require_fp8
from kimiaudio.models.kimia_lm import KimiAudioLM
from kimiaudio.models.quantize import quantize_lm
from kimiaudio.random_weights.modules import random_lm

PREFILL_SLACK = 256  # steps a sequence may decode before its whole batch does
DECODE_STEPS = 32
WARMUP_STEPS = 4


def _timed_step(engine: LLMEngine) -> tuple[float, list]:
    start = time.perf_counter()
    outputs = engine.step()  # ends reading a step's samples: timed back to back, one step each
    return time.perf_counter() - start, outputs


def _steps_until_first_token(engine: LLMEngine, request: EngineRequest) -> list[float]:
    """Times of the steps from `request`'s arrival to its first token (its prefill chunks)."""
    times = []
    while True:
        elapsed, outputs = _timed_step(engine)
        times.append(elapsed)
        if any(out.request_id == request.request_id for out in outputs):
            return times


def time_batch(engine: LLMEngine, prompts: Prompts, batch: int) -> dict:
    """B sequences decoding: decode step times, then the mixed steps while a long prompt
    prefills beside them. Every request is aborted afterwards (the pool is left empty)."""
    seq_ids = start_decoding(engine, [prompts.short() for _ in range(batch)])
    engine.step()  # with overlapped steps, launched here and read by the first timed step
    times = []
    for _ in range(DECODE_STEPS):
        elapsed, outputs = _timed_step(engine)
        times.append(elapsed)
        if len(outputs) != batch:
            raise KimiAudioError(f"decode bench: a step ran {len(outputs)} of {batch} sequences")
    long = prompts.long()
    seq_ids.append(engine.add_request(long))
    mixed = _steps_until_first_token(engine, long)
    for seq_id in seq_ids:
        engine.abort(seq_id)
    return {"times": times[WARMUP_STEPS:], "mixed": mixed}


def time_prefill(engine: LLMEngine, prompts: Prompts, runs: int = 5) -> list[float]:
    """Seconds from a long prompt's arrival, alone, to its first token (one step when it fits
    engine.max_num_batched_tokens)."""
    times = []
    for _ in range(runs + 1):
        long = prompts.long()
        seq_id = engine.add_request(long)
        times.append(sum(_steps_until_first_token(engine, long)))
        engine.abort(seq_id)
    return times[1:]  # the first one warms up


def run_random_7b(config, sessions: list[int], args, shape: dict | None = None) -> int:
    """The bench on KIMI_AUDIO_7B, or on `shape` (a config.json dict: a shrunken one for tests)."""
    from kimiaudio.checkpoint.paths import resolve_device, resolve_dtype
    from kimiaudio.pipeline.model_stack import freeze_loaded_objects

    device = resolve_device(config.model.device)
    if device.type != "cuda" and shape is None:
        raise KimiAudioError("--random-weights 7b needs a CUDA GPU (about 22 GB); pass --device cuda")
    dtype = resolve_dtype(config.model.dtype, device)
    lm = random_lm(shape or KIMI_AUDIO_7B, device, dtype)
    weights = config.model.weights if config.model.weights in ("fp8", "int8") else "bf16"
    if weights == "fp8" and shape is None:  # a test's small shape may run the emulated product
        require_fp8(device, "--weights")
    on_gpu = device.type == "cuda"
    bandwidth = copy_bandwidth(device, 1 << 30 if on_gpu else 1 << 24)
    flops = matmul_flops(device, dtype, 8192 if on_gpu else 256)
    # Room for the steps taken while the last of a batch still prefill (the prefill cap while
    # decoding admits a few prompts per step), so no sequence ends inside the timed steps.
    prompts = Prompts(lm.config, DECODE_STEPS + PREFILL_SLACK)
    freeze_loaded_objects()  # as the server does: no full garbage collection lands on a timed step
    info: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if on_gpu else "cpu",
        "dtype": str(dtype).replace("torch.", ""),
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "matmul_tflops": flops / 1e12,
        "weights": weights,
        "rows": [],
    }
    for choice in dict.fromkeys(("bf16", weights)):  # bf16 first, then the quantized layers beside it
        lm = quantize_lm(lm, choice)
        weight_bytes = decode_weight_bytes(lm)
        info["decode_weight_gb" if choice == "bf16" else f"decode_weight_gb_{choice}"] = weight_bytes / 1e9
        _measure(
            lm,
            config,
            sessions,
            prompts,
            info,
            weight_bytes / bandwidth,
            flops,
            choice,
            profile=getattr(args, "profile", False),
        )
    if on_gpu:
        info.update(card_gib=getattr(args, "card_gib", None), **peak_memory(device))
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print_report(info)
    return 0


def _engine_variants(on_gpu: bool, overlap: bool, weights: str) -> list[tuple[bool, bool]]:
    """(CUDA graphs, overlapped steps) of the engines measured: as served first, then on a GPU
    each of the two turned off alone (overlap with the bf16 weights only: what it saves is
    host time, the same whatever the weights)."""
    if not on_gpu:
        return [(False, overlap)]
    baseline = [(True, False)] if overlap and weights == "bf16" else []
    return [(True, overlap), *baseline, (False, overlap)]


def _measure(
    lm: KimiAudioLM,
    config,
    sessions: list[int],
    prompts: Prompts,
    info: dict,
    floor: float,
    flops: float,
    weights: str,
    profile: bool = False,
) -> None:
    """Rows of decode steps (on CUDA: as served, then without overlapped steps and without
    graphs, the baselines of the same run); the prefill with the bf16 weights only; with
    `profile`, a torch.profiler summary per batch size of the engine as served."""
    device, dtype = lm.device, lm.dtype
    on_gpu = device.type == "cuda"
    served = config.engine.overlap_steps
    for graphs, overlap in _engine_variants(on_gpu, served, weights):
        as_served = (graphs or not on_gpu) and overlap == served
        engine_cfg = EngineConfig(
            **{
                **vars(config.engine),
                "max_num_seqs": max(sessions),
                "cuda_graphs": graphs,
                "overlap_steps": overlap,
                "max_model_len": max(PREFILL_LEN + 16, PROMPT_LEN + DECODE_STEPS + PREFILL_SLACK + 8),
            }
        )
        engine = LLMEngine(lm, engine_cfg, device, dtype)
        for choice in engine.runner.gemm_tiles:  # measured by the first engine over these weights
            info.setdefault("gemm_tiles", []).append({"weights": weights, **asdict(choice), "tile": str(choice.tile)})
        if engine.runner.graphs is not None:
            info.update(
                capture_seconds=engine.runner.capture_seconds,
                graph_memory_bytes=engine.runner.graph_memory_bytes,
                graph_batch_sizes=engine.runner.graphs.batch_sizes,
            )
        if as_served and weights == "bf16":  # prefill is eager either way: measured once
            times = time_prefill(engine, prompts)
            ms, floor_ms = 1e3 * float(np.median(times)), 1e3 * prefill_flops(lm, PREFILL_LEN, PREFILL_LEN - 5) / flops
            info["prefill"] = {
                "positions": PREFILL_LEN,
                "continuous": PREFILL_LEN - 5,
                "ms_p50": ms,
                "floor_ms": floor_ms,
                "ratio_to_floor": ms / floor_ms,
            }
        for batch in sessions:
            measured = time_batch(engine, prompts, batch)
            p50 = percentile(measured["times"], 50, empty=math.nan)
            info["rows"].append(
                {
                    "weights": weights,
                    "batch": batch,
                    "graphs": engine.runner.graphs is not None,
                    "overlap": overlap,
                    "step_ms_p50": 1e3 * p50,
                    "step_ms_p95": 1e3 * percentile(measured["times"], 95, empty=math.nan),
                    "floor_ms": 1e3 * floor,
                    "ratio_to_floor": p50 / floor,
                    "tokens_per_s": batch / p50,
                    "mixed_step_ms_p50": 1e3 * float(np.median(measured["mixed"])),
                    "mixed_prefill_tokens": config.engine.max_prefill_tokens_while_decoding,
                }
            )
            if profile and as_served:
                info.setdefault("profile", []).append(
                    {
                        "weights": weights,
                        "batch": batch,
                        **profile_decode(
                            engine, [prompts.short() for _ in range(batch)], weight_bytes=decode_weight_bytes(lm)
                        ),
                    }
                )
        del engine
        gc.collect()  # the pool and the graphs go before the next engine sizes its pool


def print_report(info: dict) -> None:
    print(
        f"{info['device']} {info['dtype']}: {info['decode_weight_gb']:.2f} GB of weights per decode step, "
        f"copy bandwidth {info['copy_bandwidth_gb_s']:.0f} GB/s -> floor {info['rows'][0]['floor_ms']:.2f} ms; "
        f"matmul {info['matmul_tflops']:.3g} TFLOP/s"
    )
    if "capture_seconds" in info:
        print(
            f"CUDA graphs: {len(info['graph_batch_sizes'])} batch sizes captured in {info['capture_seconds']:.1f} s, "
            f"{info['graph_memory_bytes'] / 2**30:.2f} GiB"
        )
    pre = info["prefill"]
    print(
        f"prefill of {pre['positions']} positions ({pre['continuous']} with Whisper features): "
        f"{pre['ms_p50']:.1f} ms, {pre['ratio_to_floor']:.2f}x its compute floor ({pre['floor_ms']:.1f} ms)"
    )
    if info["weights"] != "bf16":
        print(
            f"{info['weights']}: {info['decode_weight_gb_' + info['weights']]:.2f} GB of weights per decode step "
            f"-> floor {info['rows'][-1]['floor_ms']:.2f} ms"
        )
    print(
        f"{'weights':>7} {'batch':>5} {'graphs':>6} {'overlap':>7} {'step p50':>9} {'step p95':>9} {'x floor':>8} "
        f"{'tok/s':>9} {'mixed p50':>10}"
    )
    for r in info["rows"]:
        print(
            f"{r['weights']:>7} {r['batch']:>5} {str(r['graphs']).lower():>6} {str(r['overlap']).lower():>7} "
            f"{r['step_ms_p50']:7.2f}ms "
            f"{r['step_ms_p95']:7.2f}ms "
            f"{r['ratio_to_floor']:8.2f} {r['tokens_per_s']:9.0f} {r['mixed_step_ms_p50']:8.2f}ms"
        )
    for p in info.get("profile", []):
        print(
            f"profile {p['weights']} batch {p['batch']} ({p['device']}): {p['wall_ms_per_step']:.2f} ms a step, "
            f"busy {p['busy_ms_per_step']:.2f} ms ({100 * p['busy_fraction']:.0f}%), "
            f"{p['kernels_per_step']:.0f} kernels a step; top: "
            + ", ".join(f"{k['name'][:40]} {k['ms_per_step']:.2f} ms" for k in p["top"][:5])
        )
        print(f"  {p['weights']} batch {p['batch']}: {groups_line(p, info['copy_bandwidth_gb_s'])}")
    print(
        f"mixed: a step with the batch's decodes and a {info['rows'][0]['mixed_prefill_tokens']}-position chunk "
        f"of a {pre['positions']}-position prompt (engine.max_prefill_tokens_while_decoding)."
    )
