"""The memory plan computed on the meta device (pipeline/memory_plan.py): against the bytes of
real modules, and `bench --memory-plan` for a 24 GiB card (fp8 and int8 fit 8 sessions of
4,096 positions; bf16 does not)."""

from __future__ import annotations

import json

import pytest
import torch

from kimiaudio.bench.random_stack import build_random_stack
from kimiaudio.cli import main
from kimiaudio.config import load_config
from kimiaudio.models.quantize import quantize_dit, quantize_lm
from kimiaudio.pipeline.memory_plan import GIB, choose_weights, memory_budget, plan_for_shape


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return load_config(
        None,
        {"model": {"device": "cpu", "dtype": "float32"}, "storage": {"data_dir": str(tmp_path_factory.mktemp("data"))}},
    )


@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_meta_plan_equals_the_plan_of_real_modules(config, weights):
    """The tiny shape's parts built for real (random weights, quantized in place) and on the
    meta device from the same config files: the same bytes in every line of the plan."""
    stack = build_random_stack(config, "tiny")
    quantize_lm(stack.lm, weights)
    quantize_dit(stack.detokenizer.dit, weights)
    sessions = config.detok.max_batch_sessions  # the meta plan caps the detokenizer's batch at the sessions
    real = memory_budget(stack, sessions, 2 * GIB, positions=64)
    meta = plan_for_shape("tiny", config, weights, weights, sessions, 2 * GIB, 64, torch.float32)
    assert meta == real
    assert meta["weights_choice"] == {"lm": weights, "dit": weights}


def _plan(capsys, weights: str) -> dict:
    assert (
        main(
            [
                "bench",
                "--memory-plan",
                "--random-weights",
                "full",
                "--weights",
                weights,
                "--card-gib",
                "24",
                "--sessions",
                "8",
                "--json",
            ]
        )
        == 0
    )
    return json.loads(capsys.readouterr().out)


def test_memory_plan_of_a_24_gib_card(capsys):
    plans = {w: _plan(capsys, w) for w in ("bf16", "fp8", "int8")}
    for weights, plan in plans.items():
        print(weights, {k: plan[k] for k in ("fits", "kv_pool_tokens", "weights_total_bytes", "tokens_per_session")})
        assert plan["weights_choice"] == {"lm": weights, "dit": weights} and plan["device_total"] == 24 * GIB
        assert plan["kv_pool_tokens"] == plan["kv_pool"] // plan["lm_kv_per_token"]
    assert not plans["bf16"]["fits"] and plans["bf16"]["weights_total_bytes"] > 24 * 10**9
    for weights in ("fp8", "int8"):
        assert plans[weights]["fits"] and plans[weights]["kv_pool_tokens"] >= 8 * 4096
        # 8-bit decoder layers: the LM under 60% of its bf16 size, the encoders and vocoder as they were.
        assert plans[weights]["weights"]["lm"] < 0.6 * plans["bf16"]["weights"]["lm"]
        for kept in ("whisper", "glm4_tokenizer", "vocoder"):
            assert plans[weights]["weights"][kept] == plans["bf16"]["weights"][kept]
    # The real model's K/V per token: 34 layers x K and V x 4 heads x 128 x 2 bytes (bf16).
    assert plans["fp8"]["lm_kv_per_token"] == 34 * 2 * 4 * 128 * 2


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


def test_card_gib_on_a_bench_run_needs_a_gpu(capsys):
    """--card-gib on a run (not a plan) caps the GPU the bench runs on; on the CPU it is refused
    in one line, before anything loads."""
    assert main(["bench", "--device", "cpu", "--random-weights", "full", "--card-gib", "24", "--sessions", "1"]) == 2
    err = capsys.readouterr().err
    assert "--card-gib 24 caps a GPU" in err and err.count("\n") == 1, err
