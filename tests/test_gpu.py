"""The device path: the CPU suite's main checks again, on a CUDA GPU (skipped without one).

`python -m pytest tests/test_gpu.py` on a machine with a GPU is the first thing to run there.
KIMIAUDIO_TEST_DEVICE picks the device (default cuda). `KIMIAUDIO_TEST_DEVICE=cpu` runs the
tests that mean something on the CPU too (how this file was checked without a GPU); the
CUDA-only ones (pool sizing from free memory, features kept off the GPU) then skip.
"""

from __future__ import annotations

import gc
import os

import pytest
import torch

from kimiaudio.config import EngineConfig, load_config
from kimiaudio.engine.llm_engine import LLMEngine
from kimiaudio.pipeline.model_stack import ModelStack
from kimiaudio.pipeline.encode_cache import EncodeCache
from kimiaudio.pipeline.request import TurnRequest
from kimiaudio.engine.sampling_params import SamplingParams
from test_bench import check_small_decode_bench
from test_engine_e2e import build_requests, check_bfloat16_engine, load_tiny_lm, reference_steps
from test_lm_golden import SECTIONS, TOL, forward_logits
from test_pipeline import run_turn, with_pipeline

DEVICE = torch.device(os.environ.get("KIMIAUDIO_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (KIMIAUDIO_TEST_DEVICE=cpu runs these on the CPU)")
cuda_only = pytest.mark.skipif(DEVICE.type != "cuda", reason="means something on CUDA only")


@pytest.mark.parametrize("section", SECTIONS)
def test_full_prompt_forward_matches_golden_on_device(golden_checkpoint, golden, section):
    text_logits, audio_logits = forward_logits(load_tiny_lm(golden_checkpoint, DEVICE), golden, section)
    torch.testing.assert_close(text_logits, golden[f"{section}.forward.text_logits"][0], **TOL)
    torch.testing.assert_close(audio_logits, golden[f"{section}.forward.audio_logits"][0], **TOL)


def test_engine_equals_reference_loop_on_device_in_fp32(golden_checkpoint, golden, golden_rules):
    # Greedy, sampled, penalised, text and fixed-length requests, a pool small enough to preempt,
    # chunked prefill: token for token what the batch-1 loop gives one request at a time.
    lm = load_tiny_lm(golden_checkpoint, DEVICE)
    requests = [req for _, req in build_requests(lm, golden, golden_rules) if not req.request_id.startswith("abort")]
    expected = {req.request_id: reference_steps(lm, req) for req in requests}
    config = EngineConfig(block_size=8, num_kv_blocks=12, max_num_batched_tokens=24, max_num_seqs=8)
    engine = LLMEngine(lm, config, DEVICE, torch.float32)
    outputs = {req.request_id: [] for req in requests}
    reasons = {}
    for req in requests:
        engine.add_request(req)
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            outputs[out.request_id].append((out.text_token, out.audio_token))
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    for rid, (steps, reason) in expected.items():
        assert outputs[rid] == steps, rid
        assert reasons[rid] == reason, rid
    assert engine.stats().num_preemptions > 0
    assert engine.stats().num_blocks_free == 12


def test_bfloat16_engine_on_device(monkeypatch, golden_checkpoint, golden, golden_rules):
    check_bfloat16_engine(DEVICE, monkeypatch, golden_checkpoint, golden, golden_rules)


@cuda_only
def test_pool_sized_from_memory_is_the_same_for_a_second_engine(golden_checkpoint):
    # The second pool must not shrink by what the first one left in the allocator's cache.
    lm = load_tiny_lm(golden_checkpoint, DEVICE, torch.bfloat16)
    # A pool far below its useful maximum, so that free memory (not the cap) sizes it.
    config = EngineConfig(block_size=16, num_kv_blocks=0, memory_fraction=0.1, max_model_len=65536, max_num_seqs=4096)
    engine = LLMEngine(lm, config, DEVICE, torch.bfloat16)
    first = engine.runner.num_blocks
    del engine
    gc.collect()  # its pool goes back to torch's cache, which the second sizing must see through
    second = LLMEngine(lm, config, DEVICE, torch.bfloat16).runner.num_blocks
    assert first > 0 and second >= 0.95 * first


def test_pipeline_turn_on_device(demo_checkpoint, speech_16k, monkeypatch):
    cached = []
    put = EncodeCache.put
    monkeypatch.setattr(EncodeCache, "put", lambda self, key, value: (cached.append(value), put(self, key, value)))
    config = load_config(None, {"model": {"path": str(demo_checkpoint), "device": str(DEVICE)},
                                "engine": {"num_kv_blocks": 256}})
    stack = ModelStack.load(config)
    assert stack.lm.device.type == DEVICE.type

    async def body(pipeline):
        turn = await run_turn(pipeline, TurnRequest("c", [], speech_16k, SamplingParams(seed=3, max_new_tokens=60)))
        return turn, pipeline.stats()

    turn, stats = with_pipeline(stack, body)
    assert turn["done"].status == "completed", turn["done"]
    assert turn["text"] == turn["done"].text and turn["pcm"].size > 0 and abs(turn["pcm"]).max() <= 1.0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    if DEVICE.type == "cuda":
        assert cached and all(features.device.type == "cpu" for _, features in cached)  # history cache off the GPU


def test_random_weight_decode_bench_on_device(capsys):
    check_small_decode_bench(str(DEVICE), capsys)
