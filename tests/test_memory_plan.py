"""The memory plan (pipeline/memory_plan.py): the same function plans the meta device's shapes and
a loaded stack; `bench --memory-plan` for a 24 GiB card lists every reserved part (fp8 and int8
fit 8 sessions of 4,096 positions; bf16 does not); a running pipeline's KV pool is the plan's,
for its own server.max_sessions; a device too small is refused in one line."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
import torch

from kimiaudio.bench.random_stack import build_random_stack
from kimiaudio.cli import main
from kimiaudio.config import load_config
from kimiaudio.errors import ConfigError
from kimiaudio.models.quantize import quantize_dit, quantize_lm
from kimiaudio.pipeline.memory_estimates import estimate
from kimiaudio.pipeline.memory_plan import (
    GIB,
    activation_bytes,
    check_plan,
    graph_logits_bytes,
    lm_tensor_bytes,
    mixed_graph_bytes,
    plan_memory,
)
from kimiaudio.pipeline.meta_stack import plan_for_shape
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.pipeline.weights_choice import choose_weights

# Every part a GPU plan of a speaking stack reserves besides the KV pool.
GPU_PARTS = {
    "weights",
    "detok_static_buffers",
    "detok_graph_pool",
    "detok_state",
    "voice_cache",
    "lm_graph_pool",
    "lm_mixed_graph_pool",
    "activations",
    "cuda_context",
    "allocator_slack",
}


def tiny_config(data_dir, **sections) -> object:
    return load_config(
        None,
        {"model": {"device": "cpu", "dtype": "float32"}, "storage": {"data_dir": str(data_dir)}, **sections},
    )


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return tiny_config(tmp_path_factory.mktemp("data"), server={"max_sessions": 4})


@pytest.fixture(scope="module")
def stack(config):
    return build_random_stack(config, "tiny")


@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_meta_plan_equals_the_plan_of_real_modules(config, weights):
    """The tiny shape's parts built for real (random weights, quantized in place) and on the
    meta device from the same config files: the same plan, line for line, detokenizer buckets
    as served (server.max_sessions = 4 rows, not detok.max_batch_sessions = 16)."""
    stack = build_random_stack(config, "tiny")
    quantize_lm(stack.lm, weights)
    quantize_dit(stack.detokenizer.dit, weights)
    real = plan_memory(stack, config, 2 * GIB, on_gpu=True, positions=64)
    meta = plan_for_shape("tiny", config, weights, weights, 2 * GIB, 64, torch.float32)
    assert meta == real
    assert meta["weights_choice"] == {"lm": weights, "dit": weights}
    assert meta["detok_batch_rows"] == 4 == stack.detokenizer.buckets.batch_sizes[-1]
    assert set(meta["reserved"]) == GPU_PARTS == set(meta["sources"])


def _plan(capsys, weights: str) -> dict:
    args = ["--weights", weights, "--card-gib", "24", "--sessions", "8", "--json"]
    assert main(["bench", "--memory-plan", "--random-weights", "full", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_memory_plan_of_a_24_gib_card(capsys):
    plans = {w: _plan(capsys, w) for w in ("bf16", "fp8", "int8")}
    for weights, plan in plans.items():
        print(weights, {k: plan[k] for k in ("fits", "kv_pool_tokens", "reserved_total", "tokens_per_session")})
        assert plan["weights_choice"] == {"lm": weights, "dit": weights} and plan["device_total"] == 24 * GIB
        # Every reserved part is listed, with where its figure comes from; the pool is the rest.
        assert set(plan["reserved"]) == GPU_PARTS and sum(plan["reserved"].values()) == plan["reserved_total"]
        assert {k: plan["sources"][k] for k in ("weights", "detok_state", "voice_cache")} == {
            "weights": "counted",
            "detok_state": "counted",
            "voice_cache": "configured",
        }
        assert all(plan["sources"][k].startswith("estimated: ") for k in ("detok_graph_pool", "lm_graph_pool"))
        # The detokenizer as served to 8 sessions: 8-row buckets, state for 8 sessions.
        assert plan["sessions"] == 8 and plan["detok_batch_rows"] == 8
        assert plan["reserved"]["detok_state"] == 8 * plan["detok_state_per_session"]
        assert plan["reserved"]["detok_graph_pool"] > 0.5 * GIB and plan["reserved"]["lm_graph_pool"] > 0.1 * GIB
        assert plan["reserved"]["lm_mixed_graph_pool"] > 0.2 * GIB
        assert plan["kv_pool_tokens"] == plan["kv_blocks"] * 16
        if plan["kv_blocks"]:
            assert plan["reserved_total"] + plan["kv_pool"] + plan["left_unused"] == 24 * GIB
            assert 0 <= plan["left_unused"] < plan["kv_block_bytes"]
    assert not plans["bf16"]["fits"] and plans["bf16"]["reserved"]["weights"] > 24 * 10**9
    for weights in ("fp8", "int8"):
        assert plans[weights]["fits"] and plans[weights]["kv_pool_tokens"] >= 8 * 4096
        # 8-bit decoder layers: the LM under 60% of its bf16 size, the encoders and vocoder as they were.
        assert plans[weights]["weights"]["lm"] < 0.6 * plans["bf16"]["weights"]["lm"]
        for kept in ("whisper", "glm4_tokenizer", "vocoder"):
            assert plans[weights]["weights"][kept] == plans["bf16"]["weights"][kept]
    # The real model's K/V per token: 34 layers x K and V x 4 heads x 128 x 2 bytes (bf16).
    assert plans["fp8"]["lm_kv_per_token"] == 34 * 2 * 4 * 128 * 2


@pytest.mark.parametrize(("sessions", "named"), [(1, "1 session "), (2, "2 sessions ")])
def test_the_printed_plan_names_its_sessions(capsys, sessions, named):
    args = ["--weights", "fp8", "--card-gib", "24", "--sessions", str(sessions)]
    assert main(["bench", "--memory-plan", "--random-weights", "full", *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"memory plan for {named}on a 24.00 GiB GPU")
    assert any(line.strip().startswith(f"fits: {named}x 4,096 positions") for line in lines)


def test_estimated_parts_grow_with_what_they_stand_for(stack, config):
    """The graph pools come from counted bases (the graphs' logits, the detokenizer's buffers);
    the activations from the largest forward: an LM prefill of max_num_batched_tokens
    positions, or the encoders' batch of 30 s windows."""
    plan = plan_memory(stack, config, 2 * GIB, on_gpu=True)
    vocab, item = stack.lm.config.vocab_size, stack.lm.dtype.itemsize
    # Decode graphs of 1..64 rows; mixed-step graphs of 16..320 tokens (64 decodes + 256 of
    # prefill), each with logits for the 64 rows of the static batch.
    assert graph_logits_bytes(stack, config) == sum([1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]) * 2 * vocab * item
    assert mixed_graph_bytes(stack, config) == 7 * 64 * 2 * vocab * item + lm_tensor_bytes(stack.lm, 320)
    assert plan["reserved"]["lm_graph_pool"] == int(estimate("lm_graph_pool") * graph_logits_bytes(stack, config))
    assert plan["reserved"]["detok_graph_pool"] == int(
        estimate("detok_graph_pool") * stack.detokenizer.flow.arena.nbytes
    )
    no_mixed = dataclasses.replace(config, engine=dataclasses.replace(config.engine, mixed_cuda_graphs=False))
    assert "lm_mixed_graph_pool" not in plan_memory(stack, no_mixed, 2 * GIB, on_gpu=True)["reserved"]
    # Utterances of one window each (4 windows, under the encoders' batch limit), then of two.
    short = dataclasses.replace(config, audio=dataclasses.replace(config.audio, max_input_seconds=30.0))
    base = activation_bytes(stack, short)
    longer = dataclasses.replace(config, audio=dataclasses.replace(config.audio, max_input_seconds=60.0))
    big_prefill = dataclasses.replace(short, engine=dataclasses.replace(config.engine, max_num_batched_tokens=1 << 20))
    assert activation_bytes(stack, longer) > base and activation_bytes(stack, big_prefill) > base
    cfg = stack.lm.config
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    per_token = 2 * cfg.hidden_size + max(qkv + cfg.hidden_size, 3 * cfg.intermediate_size)
    assert activation_bytes(stack, big_prefill) == (1 << 20) * item * per_token
    # The encoders take at most max_batch_segments windows at once, however many are waiting.
    many = dataclasses.replace(config, audio=dataclasses.replace(config.audio, encode_batch_size=256))
    assert activation_bytes(stack, many) == activation_bytes(
        stack, dataclasses.replace(config, audio=dataclasses.replace(config.audio, encode_batch_size=128))
    )


def test_the_pipeline_sizes_its_kv_pool_from_the_plan(stack, config):
    """A pipeline on a device of an injected capacity: its plan is plan_memory of its stack and
    config, its engine's pool has the plan's blocks (what is left), and a server of more
    sessions reserves their state and gets a pool smaller by that much. A stopped pipeline
    gives its pool back."""
    probe = plan_memory(stack, config, None, on_gpu=False)
    device_bytes = probe["reserved_total"] + 700 * probe["kv_block_bytes"]  # one sequence: 512 blocks
    pipeline = Pipeline(stack, config, device_bytes=device_bytes)
    plan = plan_memory(stack, config, device_bytes, on_gpu=False)
    assert pipeline.memory == plan and plan["kv_pool_source"] == "what is left"
    runner = pipeline.engine.runner
    assert runner.num_blocks == plan["kv_blocks"] == 699
    assert runner.pool.kv.untyped_storage().nbytes() == plan["kv_pool"]
    asyncio.run(_start_and_stop(pipeline))
    assert not hasattr(runner, "pool") and runner.graphs is None
    more = dataclasses.replace(config, server=dataclasses.replace(config.server, max_sessions=6))
    second = Pipeline(stack, more, device_bytes=device_bytes)
    state = 2 * plan["detok_state_per_session"]
    assert second.memory["reserved"]["detok_state"] - plan["reserved"]["detok_state"] == state
    assert (
        second.engine.runner.num_blocks
        == (device_bytes - second.memory["reserved_total"]) // plan["kv_block_bytes"] - 1
    )


async def _start_and_stop(pipeline):
    await pipeline.start()
    await pipeline.stop()


def test_a_device_too_small_is_refused_in_one_line(stack, config):
    plan = plan_memory(stack, config, None, on_gpu=False)
    one_sequence = (plan["kv_blocks_one_sequence"] + 1) * plan["kv_block_bytes"]
    device_bytes = plan["reserved_total"] + one_sequence // 2
    with pytest.raises(ConfigError) as info:
        Pipeline(stack, config, device_bytes=device_bytes)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"cpu ({device_bytes / GIB:.2f} GiB): a KV pool for one sequence")
    assert f"does not fit by {one_sequence / 2 / (1 << 20):.1f} MiB" in message and "server.max_sessions = 4" in message
    # A fixed pool that the device cannot hold, by how much.
    fixed = dataclasses.replace(config, engine=dataclasses.replace(config.engine, num_kv_blocks=1 << 20))
    with pytest.raises(ConfigError, match=r"engine\.num_kv_blocks = 1,048,576 .* does not fit by"):
        check_plan(plan_memory(stack, fixed, device_bytes, on_gpu=False), "cpu")
    # On the CPU, a fixed pool larger than the memory the machine has left.
    cpu_plan = plan_memory(stack, fixed, None, on_gpu=False)
    with pytest.raises(ConfigError, match=r"^cpu: engine\.num_kv_blocks = 1,048,576 .* does not fit in the 1\.0 MiB"):
        check_plan(cpu_plan, "cpu", host_available=1 << 20)
    assert check_plan(cpu_plan, "cpu", host_available=cpu_plan["kv_pool"]) is None
    # Enough for one sequence but not for every session: a warning, and the pipeline starts.
    roomy = plan["reserved_total"] + 2 * one_sequence
    warning = check_plan(plan_memory(stack, config, roomy, on_gpu=False), "cpu")
    assert warning.startswith("cpu: the KV pool holds") and "server.max_sessions = 4" in warning


def test_auto_takes_bf16_when_it_fits_else_fp8_else_int8():
    fits_from = {"bf16": 3, "fp8": 2, "int8": 1}  # the smallest card each choice fits on
    for card, fp8, expected in (
        (3, True, "bf16"),
        (2, True, "fp8"),
        (2, False, "int8"),
        (1, True, "int8"),
        (0, True, "int8"),
    ):

        def fits(lm, dit, card=card):
            return {"fits": card >= fits_from[lm]}

        lm, dit, plan = choose_weights("auto", "auto", fp8, fits)
        assert (lm, dit) == (expected, expected), (card, fp8)
    assert choose_weights("auto", "int8", True, lambda lm, dit: {"fits": True})[:2] == ("bf16", "int8")
    assert choose_weights("fp8", "bf16", True, lambda lm, dit: {"fits": False})[:2] == ("fp8", "bf16")


def test_bad_memory_plan_arguments_are_one_line(capsys):
    for args, says in (
        (["--card-gib", "0"], "--card-gib"),
        (["--card-gib", "24", "--positions", "0"], "--positions"),
        (["--card-gib", "24", "--weights", "fp16"], "weights"),
    ):
        assert main(["bench", "--memory-plan", "--random-weights", "full", *args]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
    # Without --memory-plan, --positions would be ignored by the bench it runs: refused.
    assert main(["bench", "--random-weights", "full", "--positions", "10"]) == 2
    err = capsys.readouterr().err
    assert "--positions goes with --memory-plan" in err and err.count("\n") == 1, err


def test_card_gib_on_a_bench_run_needs_a_gpu(capsys):
    """--card-gib on a run (not a plan) caps the GPU the bench runs on; on the CPU it is refused
    in one line, before anything loads."""
    assert main(["bench", "--device", "cpu", "--random-weights", "full", "--card-gib", "24", "--sessions", "1"]) == 2
    err = capsys.readouterr().err
    assert "--card-gib 24 caps a GPU" in err and err.count("\n") == 1, err


def test_the_start_plans_the_card_before_loading(monkeypatch, tmp_path):
    """`serve` on a GPU resolves the weights from the plan of the checkpoint's config files
    before reading any weight (here the full shapes, on a card made to look like 24 GiB, or
    20 GiB, with fp8): auto takes fp8 for 8 sessions on 24 GiB; bf16 asked for on 24 GiB is
    refused in one line naming the shortfall."""
    from kimiaudio.checkpoint.paths import CheckpointPaths
    from kimiaudio.pipeline import weights_choice
    from kimiaudio.random_weights.config_files import GLM_DIR, write_config_files
    from kimiaudio.random_weights.shapes import shape_named

    write_config_files(tmp_path, shape_named("full"))
    paths = CheckpointPaths(root=tmp_path, glm_tokenizer=tmp_path / GLM_DIR)
    monkeypatch.setattr(weights_choice, "capacity_bytes", lambda device: 24 * GIB)
    monkeypatch.setattr(weights_choice, "fp8_supported", lambda device: True)
    monkeypatch.setattr(weights_choice, "require_fp8", lambda device, key: None)
    config = tiny_config(tmp_path / "data", server={"max_sessions": 8}, engine={"max_model_len": 4096})
    cuda = torch.device("cuda", 0)
    assert weights_choice.resolve_weights(config, paths, cuda, torch.bfloat16, False) == ("fp8", "fp8")
    config.model.weights = config.detok.weights = "bf16"
    with pytest.raises(ConfigError) as info:
        weights_choice.resolve_weights(config, paths, cuda, torch.bfloat16, False)
    message = str(info.value)
    assert "\n" not in message and message.startswith("cuda:0 (24.00 GiB): a KV pool for one sequence")
    assert "does not fit by" in message and "largest: weights 24.06 GiB" in message
