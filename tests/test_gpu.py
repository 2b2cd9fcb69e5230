"""The device path: the CPU suite's main checks again, on a CUDA GPU (skipped without one).

`python -m pytest tests/test_gpu.py` on a machine with a GPU is the first thing to run there.
KIMIAUDIO_TEST_DEVICE picks the device (default cuda); `KIMIAUDIO_TEST_DEVICE=cpu` runs the
same tests on the CPU, which is how they were checked on machines without a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os

import pytest
import torch

from kimiaudio.bench_7b import KIMI_AUDIO_7B, run_random_7b
from kimiaudio.checkpoint import CheckpointPaths
from kimiaudio.config import EngineConfig, load_config
from kimiaudio.engine import LLMEngine
from kimiaudio.model_stack import ModelStack
from kimiaudio.models.attention import ContiguousKVCache
from kimiaudio.models.kimia_lm import load_lm
from kimiaudio.pipeline import Pipeline, TurnRequest
from kimiaudio.pipeline_events import AudioChunk, TextDelta, TurnDone
from kimiaudio.sampling import SamplingParams
from test_engine_e2e import CHECKPOINT, build_requests, golden_prompt, load_golden, make_request, reference_steps
from test_lm_golden import SECTIONS, TOL, _inputs

DEVICE = torch.device(os.environ.get("KIMIAUDIO_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (KIMIAUDIO_TEST_DEVICE=cpu runs these on the CPU)")


def golden_lm(dtype: torch.dtype):
    return load_lm(CheckpointPaths(root=CHECKPOINT, glm_tokenizer=CHECKPOINT / "glm-4-voice-tokenizer"), DEVICE, dtype)


@pytest.mark.parametrize("section", SECTIONS)
def test_full_prompt_forward_matches_golden_on_device(golden, section):
    lm = golden_lm(torch.float32)
    audio_ids, text_ids, mask, features = (t.to(DEVICE) for t in _inputs(golden, section))
    positions = golden[f"{section}.input.position_ids"][0].to(DEVICE)
    use_text = torch.full(mask.shape, bool(text_ids.sum() != 0), device=DEVICE)
    with torch.inference_mode():
        hidden = lm.embed(audio_ids, text_ids, use_text, features, mask)
        text_logits, audio_logits = lm(hidden, positions, ContiguousKVCache(lm.config, DEVICE, torch.float32))
    torch.testing.assert_close(text_logits.cpu(), golden[f"{section}.forward.text_logits"][0], **TOL)
    torch.testing.assert_close(audio_logits.cpu(), golden[f"{section}.forward.audio_logits"][0], **TOL)


def test_engine_equals_reference_loop_on_device_in_fp32():
    # Greedy, sampled, penalised and text requests, a pool small enough to preempt, chunked
    # prefill: token for token what the batch-1 loop gives one request at a time, on the device.
    lm = golden_lm(torch.float32)
    tensors, rules = load_golden()
    requests = [req for _, req in build_requests(lm, tensors, rules) if not req.request_id.startswith("abort")]
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


def test_bfloat16_engine_on_device_batches_and_drains():
    lm = golden_lm(torch.bfloat16)
    tensors, rules = load_golden()
    engine = LLMEngine(lm, EngineConfig(block_size=8, num_kv_blocks=40, max_num_batched_tokens=32), DEVICE,
                       torch.bfloat16)
    assert engine.runner.pool.kv.dtype == torch.bfloat16 and engine.runner.pool.kv.device.type == DEVICE.type
    for i, section in enumerate(("lm.both", "lm.text", "lm_e2e")):
        params = SamplingParams(seed=i, max_new_tokens=12, ignore_eos=True)
        engine.add_request(make_request(str(i), golden_prompt(tensors, section), params, "both", rules))
    steps, seen = 0, {}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None and 0 <= out.audio_token < lm.config.vocab_size
            seen[out.request_id] = seen.get(out.request_id, 0) + 1
        steps += 1
    assert seen == {"0": 12, "1": 12, "2": 12} and steps < 36  # decodes ran batched
    assert engine.stats().num_blocks_free == 40


def test_pool_sized_from_memory_is_the_same_for_a_second_engine():
    # The second pool must not shrink by what the first one left in the allocator's cache.
    lm = golden_lm(torch.bfloat16)
    # A pool far below its useful maximum, so that free memory (not the cap) sizes it.
    config = EngineConfig(block_size=16, num_kv_blocks=0, memory_fraction=0.1, max_model_len=65536, max_num_seqs=4096)
    engine = LLMEngine(lm, config, DEVICE, torch.bfloat16)
    first = engine.runner.num_blocks
    del engine
    gc.collect()
    second = LLMEngine(lm, config, DEVICE, torch.bfloat16).runner.num_blocks
    assert first > 0 and second >= 0.95 * first


def test_pipeline_turn_on_device(demo_checkpoint, speech_16k):
    config = load_config(None, {"model": {"path": str(demo_checkpoint), "device": str(DEVICE)},
                                "engine": {"num_kv_blocks": 256}})
    stack = ModelStack.load(config)
    assert stack.lm.device.type == DEVICE.type

    async def main():
        pipeline = Pipeline(stack, config)
        await pipeline.start()
        try:
            events = [e async for e in pipeline.submit(TurnRequest("c", [], speech_16k, SamplingParams(seed=3, max_new_tokens=60)))]
            return events, pipeline.stats(), list(pipeline._encoded.values())
        finally:
            await pipeline.stop()

    events, stats, encoded = asyncio.run(main())
    done = events[-1]
    assert isinstance(done, TurnDone) and done.status == "completed", done
    assert any(isinstance(e, TextDelta) for e in events)
    pcm = [e.pcm for e in events if isinstance(e, AudioChunk)]
    assert pcm and all(p.dtype.name == "float32" and abs(p).max() <= 1.0 for p in pcm)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert all(features.device.type == "cpu" for _, features in encoded)  # history cache off the GPU


def test_random_weight_decode_bench_on_device(capsys):
    shape = {**KIMI_AUDIO_7B, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
             "num_attention_heads": 8, "num_key_value_heads": 2, "kimia_mimo_layers": 2,
             "kimia_mimo_transformer_from_layer_index": 2, "kimia_adaptor_input_dim": 32}
    config = load_config(None, {"model": {"device": str(DEVICE)}, "engine": {"num_kv_blocks": 512}})
    assert run_random_7b(config, [1, 8], argparse.Namespace(json=True), shape=shape) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["batch"] for r in rows] == [1, 8]
    assert all(r["step_ms_p50"] > 0 and r["floor_ms"] > 0 for r in rows)
