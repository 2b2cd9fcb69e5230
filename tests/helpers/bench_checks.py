"""What a small `bench --random-weights` run must report (the CPU test and the GPU test run it)."""

from __future__ import annotations

import argparse
import json

from kimiaudio.bench.decode_7b import run_random_7b
from kimiaudio.bench.prompts_7b import KIMI_AUDIO_7B
from kimiaudio.config import load_config

SMALL_7B = {
    **KIMI_AUDIO_7B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "kimia_mimo_layers": 1,
    "kimia_mimo_transformer_from_layer_index": 1,
    "kimia_adaptor_input_dim": 32,
}


def check_small_decode_bench(device: str, capsys) -> None:
    """`bench --random-weights` on a small shape of the 7B config (the same code path)."""
    config = load_config(None, {"model": {"device": device}, "engine": {"num_kv_blocks": 512}})
    assert run_random_7b(config, [1, 4], argparse.Namespace(json=True, profile=True), shape=SMALL_7B) == 0
    report = json.loads(capsys.readouterr().out)
    on_gpu = device.startswith("cuda")
    # --profile: one summary a batch size, of the engine as served (graphs on CUDA).
    assert [(p["weights"], p["batch"]) for p in report["profile"]] == [("bf16", 1), ("bf16", 4)]
    for p in report["profile"]:
        assert p["device"] == ("cuda kernels" if on_gpu else "cpu operators (no GPU)") and p["steps"] == 10
        assert p["kernels_per_step"] > 0 and p["busy_ms_per_step"] > 0 and p["wall_ms_per_step"] > 0
        times = [k["ms_per_step"] for k in p["top"]]
        assert times == sorted(times, reverse=True) and sum(k["share_of_busy"] for k in p["top"]) <= 1 + 1e-9
        # The linears (aten::linear on the CPU) as the GEMM group, their bandwidth over the bytes.
        assert p["groups_ms_per_step"]["gemm"] > 0 and p["gemm_gb_s"] > 0 and p["gemm_weight_gb"] > 0
    # (graphs, overlapped steps): the engine as served, then on CUDA each of the two turned off
    # alone, in the same run; eager only on the CPU.
    served = config.engine.overlap_steps
    variants = [(True, served), *([(True, False)] if served else []), (False, served)] if on_gpu else [(False, served)]
    assert [(r["batch"], r["graphs"], r["overlap"]) for r in report["rows"]] == [
        (b, g, o) for g, o in variants for b in (1, 4)
    ]
    for r in report["rows"]:
        assert r["step_ms_p50"] > 0 and r["ratio_to_floor"] > 0 and r["step_ms_p50"] <= r["step_ms_p95"]
        assert r["mixed_step_ms_p50"] > 0 and r["mixed_prefill_tokens"] == 256
    prefill = report["prefill"]
    assert prefill["positions"] == 1000 and prefill["ms_p50"] > 0 and prefill["ratio_to_floor"] > 0
    assert report["matmul_tflops"] > 0
    if on_gpu:
        # The graphs' private pools hold at least every captured decode batch's logits (both heads, bf16).
        assert report["capture_seconds"] > 0 and report["graph_batch_sizes"] == [1, 2, 4]
        assert report["graph_memory_bytes"] >= sum(report["graph_batch_sizes"]) * 2 * SMALL_7B["vocab_size"] * 2
