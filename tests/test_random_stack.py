"""The random-weight stack (bench --random-weights full) at its tiny CPU shape: every part is
built through the real code, encodes speech, detokenizes, runs through the pipeline unchanged,
and its memory plan adds up."""

import dataclasses

import numpy as np
import pytest
import torch

from kimiaudio.bench.random_stack import build_random_stack
from kimiaudio.config import EngineConfig, load_config
from kimiaudio.detok.detokenizer import Detokenizer
from kimiaudio.engine.kv_pool import max_useful_blocks
from kimiaudio.engine.llm_engine import LLMEngine
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.memory_plan import GIB, plan_memory
from kimiaudio.pipeline.memory_report import format_memory_plan
from kimiaudio.pipeline.pipeline import TurnRequest
from kimiaudio.random_weights.shapes import SHAPES

from helpers.pipeline_turns import run_turn, with_pipeline


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    config = load_config(
        None,
        {
            "model": {"device": "cpu"},
            "storage": {"data_dir": str(tmp_path_factory.mktemp("data"))},
            "engine": {"num_kv_blocks": 64, "block_size": 8},
        },
    )
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


def storage_bytes(module) -> int:
    """Bytes of the storages behind a module's parameters and buffers, each storage once."""
    storages = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def held_bytes(session) -> int:
    """What a detokenizer session holds between calls: its prefix K/V and vocoder overlap."""
    held = [session.kv, session.pre_mel, session.pre_wav]
    return sum(t.untyped_storage().nbytes() for t in held if t is not None)


def test_memory_plan(stack):
    """The plan against the memory of real tensors: the built modules' weights, the engine's
    KV pool, a detokenizer session's state at its K/V cap; and the pool is what is left."""
    config = dataclasses.replace(stack.config, engine=dataclasses.replace(stack.config.engine, num_kv_blocks=0))
    config.server = dataclasses.replace(config.server, max_sessions=64)
    plan = plan_memory(stack, config, 80 * GIB, on_gpu=False)
    detok = stack.detokenizer
    parts = {
        "lm": stack.lm,
        "whisper": stack.whisper.encoder,
        "glm4_tokenizer": stack.glm4.model,
        "dit": detok.dit,
        "vocoder": detok.vocoder,
    }
    assert plan["weights"] == {name: storage_bytes(module) for name, module in parts.items()}
    assert plan["reserved"]["weights"] == sum(plan["weights"].values())
    # A token's K/V: what the engine's own pool allocates per position.
    engine = LLMEngine(
        stack.lm,
        EngineConfig(block_size=4, num_kv_blocks=10, max_num_batched_tokens=16, max_num_seqs=2, cuda_graphs=False),
        "cpu",
        stack.dtype,
    )
    pool = engine.runner.pool
    assert plan["lm_kv_per_token"] * (pool.num_blocks + 1) * pool.block_size == pool.kv.untyped_storage().nbytes()
    # A session's state: what one holds, driven past its K/V cap (fewer ODE steps: same sizes).
    cheap = Detokenizer(
        detok.dit, detok.vocoder, dataclasses.replace(detok.cfg, first_ode_steps=2, ode_steps=2, min_ode_steps=2)
    )
    assert cheap.state_bytes_per_stream() == plan["detok_state_per_session"] > 0
    session, most, capped = cheap.new_stream(seed=0), 0, False
    tokens = torch.randint(0, SHAPES["tiny"].codes, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    while not capped:
        cheap.step_batch([(session, tokens, False)])
        most = max(most, held_bytes(session))
        capped = session.kv is not None and session.kv.shape[3] == detok.cfg.max_kv_cache_frames
    assert most <= plan["detok_state_per_session"] and session.kv.untyped_storage().nbytes() < most
    # Reserved: the weights, the detokenizer's static buffers, every session's state, the voice
    # cache, the eager detokenizer's and the largest forward's activations (no CUDA graphs, no
    # context on the CPU); the KV pool gets what is left in whole blocks.
    assert plan["reserved"]["detok_static_buffers"] == detok.flow.arena.nbytes
    assert plan["reserved"]["detok_state"] == 64 * plan["detok_state_per_session"]
    assert set(plan["reserved"]) == {
        "weights",
        "detok_static_buffers",
        "detok_state",
        "voice_cache",
        "detok_activations",
        "activations",
    }
    # On 80 GiB the pool stops at what max_num_seqs x max_model_len can use; on a device just
    # larger than the reserved parts it is what is left, in whole blocks (its scratch block too).
    assert plan["kv_blocks"] == max_useful_blocks(config.engine) and plan["kv_pool_source"] == "what is left"
    assert plan["reserved_total"] + plan["kv_pool"] + plan["left_unused"] == 80 * GIB
    small = plan_memory(stack, config, plan["reserved_total"] + 100 * plan["kv_block_bytes"] + 5, on_gpu=False)
    assert small["kv_blocks"] == 99 and small["kv_pool"] == 100 * small["kv_block_bytes"] and small["left_unused"] == 5
    assert plan_memory(stack, config, plan["reserved_total"], on_gpu=False)["kv_blocks"] == 0  # never below 0
    assert plan["kv_pool_tokens"] == plan["kv_blocks"] * config.engine.block_size
    text = format_memory_plan(plan)
    assert "LM KV pool (what is left)" in text and "detok state" in text
    assert f"{plan['kv_pool_tokens']:,} tokens" in text
