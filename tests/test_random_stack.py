"""The random-weight stack (bench --random-weights full) at its tiny CPU shape: every part is
built through the real code, encodes speech, detokenizes, runs through the pipeline unchanged,
and its memory plan adds up."""

import numpy as np
import pytest
import torch

from kimiaudio.bench.memory_budget import GIB, format_memory_budget, memory_budget
from kimiaudio.bench.random_stack import build_random_stack
from kimiaudio.config import load_config
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.pipeline import TurnRequest
from kimiaudio.random_weights.shapes import SHAPES
from test_pipeline import run_turn, with_pipeline


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    config = load_config(None, {"model": {"device": "cpu"}, "storage": {"data_dir": str(tmp_path_factory.mktemp("data"))},
                                "engine": {"num_kv_blocks": 64, "block_size": 8}})
    return build_random_stack(config, "tiny")


@pytest.fixture(scope="module")
def pcm():
    return (np.random.default_rng(0).standard_normal(16000 * 2) * 0.1).astype(np.float32)


def test_parts_and_shapes(stack, pcm):
    codes = SHAPES["tiny"].codes
    assert stack.is_demo and stack.dtype == torch.float32 and set(stack.load_seconds) >= {"lm", "detokenizer"}
    assert stack.lm.config.vocab_size == stack.specials.token_offset + codes
    assert stack.detokenizer.dit.cfg.semantic_vocab_size == codes == stack.glm4.model.config.quantize_vocab_size
    assert float(stack.lm.mimo_output.weight[: stack.specials.token_offset].abs().max()) == 0.0
    tokens, features = stack.encode_speech(pcm)
    assert len(tokens) == features.shape[0] == 25 and features.shape[1] == stack.lm.config.kimia_adaptor_input_dim
    assert all(0 <= t < codes for t in tokens)
    wav = stack.detokenizer.detokenize(tokens, seed=0)
    assert wav.shape == (len(tokens) * stack.detokenizer.samples_per_token,) and bool(torch.isfinite(wav).all())
    with pytest.raises(KimiAudioError, match="shape"):
        build_random_stack(stack.config, "huge")


def test_the_pipeline_runs_it(stack, pcm):
    params = SamplingParams.from_config(stack.config.sampling, seed=1, max_new_tokens=30)

    async def body(pipeline):
        return await run_turn(pipeline, TurnRequest("c", [], pcm, params))

    got = with_pipeline(stack, body)
    assert got["done"].status == "completed"
    assert len(got["done"].audio_tokens) == 30 - 6  # every step after the delay is a speech code
    assert got["pcm"].size == 24 * stack.detokenizer.samples_per_token


def test_memory_plan(stack):
    plan = memory_budget(stack, sessions=64, device_bytes=80 * GIB)
    weights = sum(p.numel() * p.element_size() for p in stack.lm.parameters())
    assert plan["weights"]["lm"] >= weights and plan["detok_state_all_sessions"] == 64 * plan["detok_state_per_session"]
    assert plan["kv_pool"] == 80 * GIB - plan["fixed_total"] - plan["headroom"]
    cfg = stack.lm.config
    assert plan["lm_kv_per_token"] == cfg.num_kv_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 4
    text = format_memory_budget(plan)
    assert "LM KV pool (sized last)" in text and "detok state" in text
