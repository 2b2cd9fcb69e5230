"""Voices in the pipeline (demo checkpoint): a voice is computed once and shared by every turn
in it, each turn's speech equals the offline detokenizer in that voice, other turns are
untouched, an evicted prefix is recomputed, and a bad reference fails cleanly."""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest
import torch

from kimiaudio.audio.io import load_audio
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.turn_request import TurnRequest
from kimiaudio.pipeline.voice_registry import UnknownVoiceError, Voice, VoiceRegistry

from helpers.pipeline_turns import load_demo_stack, run_turn, settled_stats, voices, with_pipeline


@pytest.fixture(scope="module")
def stack(demo_checkpoint):
    return load_demo_stack(demo_checkpoint)


@pytest.fixture(scope="module")
def reference(speech_wav):
    """The espeak sentence at both rates a voice needs."""
    return load_audio(speech_wav, 16000), load_audio(speech_wav, 24000)


def test_voice_is_computed_once_and_shared(stack, speech_16k, reference):
    inputs = voices(speech_16k, 4)
    params = [SamplingParams.from_config(stack.config.sampling, seed=20 + i, max_new_tokens=40) for i in range(4)]

    async def body(pipeline):
        before = pipeline.stats()["voice_prefill_calls"]
        voice = await pipeline.make_voice("espeak", *reference)
        after_add = pipeline.stats()
        results = await asyncio.gather(
            *[
                run_turn(pipeline, TurnRequest("c", [], x, p, voice=voice if i < 3 else None))
                for i, (x, p) in enumerate(zip(inputs, params))
            ]
        )
        return voice, before, after_add, results, await settled_stats(pipeline)

    voice, before, after_add, results, stats = with_pipeline(stack, body)
    calls = after_add["voice_prefill_calls"] - before
    assert calls >= 1 and after_add["voice_prefixes_built"] == 1
    # three turns in the voice ran without computing it again
    assert stats["voice_prefill_calls"] - before == calls and stats["voice_prefixes_built"] == 1
    assert stats["max_batch_sizes"]["detok"] >= 2
    assert len(voice.codes) == len(voice.wav24k) // 1920 + (len(voice.wav24k) % 1920 > 0)  # 12.5 Hz
    detok = stack.detokenizer
    prefix = detok.voice_prefix(torch.from_numpy(voice.wav24k), voice.codes, stack.config.voices.max_prompt_chunks)
    for i, (p, got) in enumerate(zip(params, results)):
        done = got["done"]
        assert done.status == "completed" and done.audio_tokens
        wav = detok.detokenize(done.audio_tokens, seed=p.seed, voice=prefix if i < 3 else None).numpy()
        np.testing.assert_allclose(got["pcm"], wav, atol=1e-4, rtol=1e-4)
    plain = detok.detokenize(results[0]["done"].audio_tokens, seed=params[0].seed).numpy()
    assert np.abs(plain - results[0]["pcm"]).max() > 1e-3  # the voice changed the speech


def test_evicted_voice_is_recomputed(stack, reference):
    pcm16, pcm24 = reference
    config = copy.deepcopy(stack.config)
    config.voices.cache_mib = 0  # room for one prefix (the newest is always kept)
    params = SamplingParams.from_config(stack.config.sampling, seed=5, max_new_tokens=20)

    async def body(pipeline):
        a = await pipeline.make_voice("a", pcm16, pcm24)
        b = await pipeline.make_voice("b", pcm16[: len(pcm16) * 2 // 3], pcm24[: len(pcm24) * 2 // 3])
        first = pipeline.stats()
        done = (await run_turn(pipeline, TurnRequest("c", [], pcm16, params, voice=a)))["done"]
        await pipeline.prepare_voice(b)
        return first, done, pipeline.stats()

    first, done, last = with_pipeline(stack, body, config)
    assert done.status == "completed"
    assert first["voice_prefixes_built"] == 2 and first["voice_prefixes_cached"] == 1
    assert last["voice_prefixes_built"] == 4 and last["voice_prefixes_cached"] == 1  # a, then b again


def test_bad_reference_fails_cleanly(stack):
    async def body(pipeline):
        with pytest.raises(KimiAudioError):
            await pipeline.make_voice("tiny", np.full(400, 0.1, np.float32), np.full(600, 0.1, np.float32))
        return pipeline.stats()

    assert with_pipeline(stack, body)["voice_prefixes_built"] == 0


def test_registry_names():
    registry = VoiceRegistry()
    voice = Voice.create("alloy", np.zeros(10, np.float32), [1, 2])
    assert registry.resolve(None) is None and registry.resolve("alloy") is None and registry.resolve("kimi") is None
    with pytest.raises(UnknownVoiceError, match="unknown voice 'nobody'"):
        registry.resolve("nobody")
    registry.add(voice)
    assert registry.resolve("alloy") is voice  # a stored voice wins over the stock name
    assert VoiceRegistry(default="alloy").resolve(None) is None
    assert Voice.create("x", np.zeros(10, np.float32), [1, 2]).key == voice.key
    assert Voice.create("x", np.zeros(10, np.float32), [1, 3]).key != voice.key


def test_openai_voice_names_speak_in_the_configured_voice():
    narrator = Voice.create("narrator", np.zeros(10, np.float32), [1, 2])
    registry = VoiceRegistry(openai_voice="narrator")
    registry.add(narrator)
    assert registry.resolve("alloy") is narrator and registry.resolve("verse") is narrator
    assert registry.resolve("kimi") is None  # the model's own voice, by name
    with pytest.raises(UnknownVoiceError):
        registry.resolve("nobody")
    assert VoiceRegistry(openai_voice="gone").resolve("kimi") is None
    with pytest.raises(UnknownVoiceError, match="'gone'"):  # a configured voice since deleted
        VoiceRegistry(openai_voice="gone").resolve("alloy")
