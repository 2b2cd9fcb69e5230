"""`bench --memory-estimates`: measure on a GPU what pipeline/memory_estimates.py estimates.

Builds the random full-size stack (bench --random-weights full's, served to max(--sessions))
and measures, each against the counted base the plan multiplies (memory_plan.py):
- detok_graph_pool: the memory prepare_for_serving adds, per byte of the static buffers, for
  the stack's detokenizer (buckets of max(--sessions) rows, at most detok.max_batch_sessions);
- lm_graph_pool: the decode graphs' private pool per byte of their logits (engine.max_num_seqs);
  lm_mixed_graph_pool: the mixed-step graphs' pool per byte of what the plan counts of them;
- activations: the allocator's peak beyond what is held before, over the largest forward's
  counted tensors: an LM prefill of engine.max_num_batched_tokens positions, and the speech
  encoders' largest batch (audio.encode_batch_size utterances of audio.max_input_seconds);
- cuda_context: device memory in use outside torch's allocator (this process alone on the GPU);
- allocator_slack: the allocator's reserved peak beyond its allocated peak.
It prints the measured values beside the table's and the entries to write there (the margins
kept); .ci/gpu-check's `estimates` step keeps the JSON in its report.
"""

from __future__ import annotations

import gc
import json

import numpy as np
import torch

from kimiaudio.errors import KimiAudioError
from kimiaudio.layers.device_memory import GIB


def _settle(device: torch.device) -> None:
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()


def _outside_allocator(device: torch.device) -> int:
    free, total = torch.cuda.mem_get_info(device)
    return total - free - torch.cuda.memory_reserved(device)


def _peak_beyond(device: torch.device, run) -> int:
    """The allocator's allocated peak while `run()` runs, beyond what it held before."""
    _settle(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    run()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def _detok_graphs(stack) -> dict:
    """The stack's detokenizer (built here, its graphs not captured yet) prepared for serving."""
    detok = stack.detokenizer
    info = detok.prepare_for_serving()
    return {
        "rows": detok.buckets.batch_sizes[-1],
        "graph_pool_bytes": info["added_bytes"],
        "static_buffer_bytes": detok.flow.arena.nbytes,
    }


def _lm_measures(stack, config, device) -> dict:
    from kimiaudio.engine.llm_engine import LLMEngine
    from kimiaudio.engine.request import EngineRequest, RequestPrompt
    from kimiaudio.engine.sampling_params import SamplingParams
    from kimiaudio.pipeline.memory_plan import graph_logits_bytes, mixed_graph_bytes

    cfg = stack.lm.config
    engine = LLMEngine(stack.lm, config.engine, device, stack.dtype, num_blocks=1024)
    runner = engine.runner
    graphs = {
        "graph_pool_bytes": runner.graphs.memory_bytes if runner.graphs else 0,
        "graph_logits_bytes": graph_logits_bytes(stack, config),
        "mixed_graph_pool_bytes": runner.mixed_graphs.memory_bytes if runner.mixed_graphs else 0,
        "mixed_graph_counted_bytes": mixed_graph_bytes(stack, config),
    }
    tokens = min(config.engine.max_num_batched_tokens, 1024 * config.engine.block_size)
    blank = stack.specials.text_blank
    rng = np.random.default_rng(0)

    def prefill():
        # New codes each time: a prompt the prefix cache has seen would not be computed again.
        codes = rng.integers(cfg.kimia_token_offset, cfg.vocab_size, tokens).tolist()
        params = SamplingParams(seed=0, max_new_tokens=1, ignore_eos=True)
        engine.add_request(
            EngineRequest(
                "prefill", RequestPrompt(codes, [blank] * tokens, [0] * tokens, None), params, "both", stack.specials
            )
        )
        while engine.has_work():
            engine.step()

    prefill()  # warm: kernels chosen, rotary tables built
    peak = _peak_beyond(device, prefill)
    engine.release()
    return {**graphs, "prefill_peak": peak}


def _encoder_peak(stack, config, device) -> int:
    seconds = config.audio.max_input_seconds
    pcm = (np.random.default_rng(0).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)
    batch = [pcm] * config.audio.encode_batch_size
    stack.encode_speech_batch(batch[:1])  # warm
    return _peak_beyond(device, lambda: stack.encode_speech_batch(batch))


def measure(config, device: torch.device, shape: str = "full") -> dict:
    """Every estimate measured on `device` with the random stack of `shape`."""
    from kimiaudio.bench.random_stack import build_random_stack
    from kimiaudio.pipeline.memory_estimates import ESTIMATES
    from kimiaudio.pipeline.memory_plan import activation_bytes

    torch.ones(8, 8, device=device) @ torch.ones(8, 8, device=device)  # cuBLAS loaded
    torch.nn.functional.conv1d(torch.ones(1, 1, 8, device=device), torch.ones(1, 1, 3, device=device))  # cuDNN
    torch.cuda.synchronize(device)
    stack = build_random_stack(config, shape)
    detok = _detok_graphs(stack)
    _settle(device)
    lm = _lm_measures(stack, config, device)
    encoders = _encoder_peak(stack, config, device)
    _settle(device)
    counted = activation_bytes(stack, config)
    measured = {
        "detok_graph_pool": detok["graph_pool_bytes"] / detok["static_buffer_bytes"],
        "lm_graph_pool": lm["graph_pool_bytes"] / lm["graph_logits_bytes"],
        "lm_mixed_graph_pool": lm["mixed_graph_pool_bytes"] / lm["mixed_graph_counted_bytes"],
        "activations": max(lm["prefill_peak"], encoders) / counted,
        "cuda_context": _outside_allocator(device),
        "allocator_slack": torch.cuda.max_memory_reserved(device) - torch.cuda.max_memory_allocated(device),
    }
    return {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "measured": measured,
        "table_now": {name: e.measured for name, e in ESTIMATES.items()},
        "proposed": {name: {"measured": round(v, 4), "margin": ESTIMATES[name].margin} for name, v in measured.items()},
        "details": {
            "detok": detok,
            "lm": lm,
            "encoders_peak": encoders,
            "activations_counted": counted,
            "lm_weights": getattr(stack.lm, "weights", "bf16"),
        },
    }


def run_memory_estimates(config, args) -> int:
    from kimiaudio.checkpoint.paths import resolve_device

    device = resolve_device(config.model.device)
    if device.type != "cuda":
        raise KimiAudioError("--memory-estimates measures a GPU: run it with --device cuda")
    report = measure(config, device)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"memory estimates measured on {report['device']} (torch {report['torch']}, CUDA {report['cuda']}):")
    for name, value in report["measured"].items():
        now = report["table_now"][name]
        in_bytes = name in ("cuda_context", "allocator_slack")
        value, now, unit = (value / GIB, now / GIB, " GiB") if in_bytes else (value, now, "")
        print(f"  {name:<18} measured {value:9.3f}{unit:<4}   table {now:9.3f}{unit}")
    print("write the measured values into pipeline/memory_estimates.py (with this device and date as the source)")
    return 0
