"""Failure containment (issue: "any exception while handling a turn fails that turn alone").

A failure is injected at each stage of the pipeline (speech encoding, prompt building, the
model runner, the engine's own bookkeeping, the detokenizer): every turn still ends with one
TurnDone, the failed ones with status failed and a message, the others completed; the KV pool
is whole again and the next turn is served. The injected errors are plain Python exceptions,
not the project's own error type.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from kimiaudio.engine.llm_engine import LLMEngine
from kimiaudio.engine.model_runner import ModelRunner
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline import lm_worker
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.pipeline.turn_request import TurnRequest

from helpers.pipeline_turns import load_demo_stack, run_turn, settled_stats, voices, with_pipeline
from helpers.worker_faults import Broken


@pytest.fixture(scope="module")
def stack(demo_checkpoint):
    return load_demo_stack(demo_checkpoint)


def turns_with(stack, inputs, body_before=None, params=None):
    """Run one turn per input concurrently, then one more turn; return (results, stats, last)."""
    params = params or SamplingParams(seed=1, max_new_tokens=40, ignore_eos=True)

    async def body(pipeline):
        results = await asyncio.wait_for(
            asyncio.gather(*[run_turn(pipeline, TurnRequest("c", [], x, params)) for x in inputs]), 60
        )
        stats = await settled_stats(pipeline)
        after = await asyncio.wait_for(run_turn(pipeline, TurnRequest("c", [], inputs[-1], params)), 60)
        return results, stats, after

    return with_pipeline(stack, body)


def assert_contained(results, stats, after, failed: set[int], stage: str):
    for i, result in enumerate(results):
        done = result["done"]
        if i in failed:
            assert done.status == "failed" and stage in done.error, (i, done)
        else:
            assert done.status == "completed", (i, done)
    assert stats["turns"] == 0 and stats["running"] == 0 and stats["waiting"] == 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert after["done"].status == "completed" and after["pcm"].size > 0


def test_encoding_failure_fails_only_that_utterances_turn(stack, speech_16k, monkeypatch):
    inputs = voices(speech_16k, 3)
    poisoned = inputs[1].size
    real = stack.encode_speech_stages

    def encode(pcms):
        stages = real(pcms)
        yield next(stages)  # the failure comes mid-batch, after a stage has run
        if any(p.size == poisoned for p in pcms):
            raise IndexError("injected encoder bug")
        return (yield from stages)

    monkeypatch.setattr(stack, "encode_speech_stages", encode)
    results, stats, after = turns_with(stack, inputs[:2] + [inputs[2]])
    assert_contained(results, stats, after, {1}, "speech encoding failed (IndexError")


def test_prompt_failure_fails_only_that_turn(stack, speech_16k, monkeypatch):
    calls = []
    real = lm_worker.build_prompt

    def build(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise TypeError("injected prompt bug")
        return real(*args, **kwargs)

    monkeypatch.setattr(lm_worker, "build_prompt", build)
    results, stats, after = turns_with(stack, voices(speech_16k, 3))
    failed = [i for i, r in enumerate(results) if r["done"].status == "failed"]
    assert len(failed) == 1
    assert_contained(results, stats, after, set(failed), "starting the turn failed (TypeError")


def test_model_runner_failure_fails_the_step_and_serving_goes_on(stack, speech_16k, monkeypatch):
    calls = []

    def failing(real):
        def run_or_launch(self, plan, *previous):  # a step read at once, or launched
            calls.append(len(plan))
            if len(calls) == 3:  # mid-generation, with every turn in the batch
                raise RuntimeError("injected kernel failure")
            return real(self, plan, *previous)

        return run_or_launch

    monkeypatch.setattr(ModelRunner, "run", failing(ModelRunner.run))
    monkeypatch.setattr(ModelRunner, "launch", failing(ModelRunner.launch))
    results, stats, after = turns_with(stack, voices(speech_16k, 2))
    assert all(r["done"].status == "failed" for r in results)  # both ran in the failing step
    assert_contained(results, stats, after, {0, 1}, "engine step failed: RuntimeError")


def test_engine_bookkeeping_failure_fails_live_turns_and_serving_goes_on(stack, speech_16k, monkeypatch):
    calls = []
    real = LLMEngine.step

    def step(self):
        calls.append(1)
        if len(calls) == 4:
            raise KeyError("injected scheduler bug")
        return real(self)

    monkeypatch.setattr(LLMEngine, "step", step)
    results, stats, after = turns_with(stack, voices(speech_16k, 2))
    assert_contained(results, stats, after, {0, 1}, "generation failed (KeyError")


def test_detokenizer_failure_fails_its_turns_alone(stack, speech_16k, monkeypatch):
    inputs = voices(speech_16k, 3)
    real = stack.detokenizer.step_batch
    calls = []

    def step_batch(items, **options):
        calls.append(len(items))
        if len(calls) == 1:
            raise ValueError("injected vocoder bug")
        return real(items, **options)

    monkeypatch.setattr(stack.detokenizer, "step_batch", step_batch)
    # One stream per detokenizer batch, so the injected failure hits exactly one turn.
    stack.config.detok.max_batch_sessions, saved = 1, stack.config.detok.max_batch_sessions
    try:
        results, stats, after = turns_with(
            stack, inputs, params=SamplingParams(seed=1, max_new_tokens=80, ignore_eos=True)
        )
    finally:
        stack.config.detok.max_batch_sessions = saved
    failed = {i for i, r in enumerate(results) if r["done"].status == "failed"}
    assert len(failed) == 1
    assert_contained(results, stats, after, failed, "detokenizer failed (ValueError")
    # The failed turn's answer stopped early: its generation was dropped, not run to the end.
    (i,) = failed
    assert len(results[i]["done"].audio_tokens) < 80


def test_bad_audio_values_fail_their_turn(stack, speech_16k):
    bad = np.full(16000, np.nan, dtype=np.float32)
    results, stats, after = turns_with(stack, [bad, speech_16k])
    assert results[0]["done"].status == "failed" and "NaN" in results[0]["done"].error
    assert results[1]["done"].status == "completed"
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] and after["done"].status == "completed"


async def broken_worker_turns(pipeline, inputs, params):
    results = await asyncio.wait_for(
        asyncio.gather(*[run_turn(pipeline, TurnRequest("c", [], x, params)) for x in inputs]), 60
    )
    with pytest.raises(KimiAudioError, match="model workers stopped"):
        pipeline.submit(TurnRequest("c", [], inputs[0], params))
    return results, pipeline.workers_alive


@pytest.mark.parametrize("where", ["lm", "lm-admit", "detok"])
def test_a_worker_whose_loop_breaks_fails_every_turn_and_refuses_new_ones(stack, speech_16k, monkeypatch, where):
    """No turn waits for a thread that is gone: those in flight end failed, naming the worker;
    new ones are refused; the pipeline still stops cleanly. (lm-admit: the loop breaks as a
    turn is admitted, e.g. a tokenizer's panic; that turn is failed too.)"""
    calls = []
    if where == "lm-admit":

        def turn_prompt(*args, **kwargs):
            raise Broken("injected")

        monkeypatch.setattr(lm_worker, "turn_prompt", turn_prompt)
    elif where == "lm":
        real = LLMEngine.step

        def step(self):
            calls.append(1)
            if len(calls) == 4:  # mid-generation
                raise Broken("injected")
            return real(self)

        monkeypatch.setattr(LLMEngine, "step", step)
    else:

        def step_batch(items, **options):
            raise Broken("injected")

        monkeypatch.setattr(stack.detokenizer, "step_batch", step_batch)
    params = SamplingParams(seed=1, max_new_tokens=40, ignore_eos=True)
    results, alive = with_pipeline(stack, lambda p: broken_worker_turns(p, voices(speech_16k, 2), params))
    assert not alive
    for result in results:
        done = result["done"]
        worker = where.removesuffix("-admit")
        assert done.status == "failed" and f"kimiaudio-{worker} worker stopped (Broken: injected)" in done.error


def test_a_worker_that_cannot_start_fails_the_pipeline_start(stack, monkeypatch):
    def no_device(device, threads):
        raise RuntimeError("injected: the device is gone")

    monkeypatch.setattr("kimiaudio.pipeline.worker.configure_worker_thread", no_device)

    async def start():
        pipeline = Pipeline(stack, stack.config)
        with pytest.raises(KimiAudioError, match="worker could not start .RuntimeError: injected"):
            await pipeline.start()
        with pytest.raises(KimiAudioError, match="not running"):
            pipeline.submit(TurnRequest("c", [], np.zeros(16000, np.float32)))

    asyncio.run(start())
