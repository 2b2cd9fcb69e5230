"""Voice prompts in the detokenizer: the official mel and prefill against the golden's `voice.*`,
streaming after it, the position reset back to the voice, and streams in different voices
batched (padded, per-row prefixes of different lengths) equal to each alone."""

import dataclasses

import pytest
import torch

from kimiaudio.config import DetokConfig
from kimiaudio.detok.detokenizer import Detokenizer
from kimiaudio.detok.streaming import DetokStream
from kimiaudio.detok.voice_prefix import PROMPT_CHUNK_FRAMES, prefill_spans
from kimiaudio.errors import KimiAudioError

from helpers.detok_reference import TOL, random_tokens


@pytest.fixture(scope="module")
def fast(detok):
    """Same weights, the low-latency schedule with few ODE steps (tests comparing code with itself)."""
    return Detokenizer(
        detok.dit, detok.vocoder, DetokConfig(ode_steps=4, first_ode_steps=3, min_ode_steps=3), mel=detok.mel
    )


@pytest.fixture(scope="module")
def voice_meta(golden_meta):
    return golden_meta["sections"]["voice"]


def golden_voice(detok, golden, voice_meta):
    return detok.voice_prefix(golden["voice.ref_wav24k"], golden["voice.ref_codes"][0], voice_meta["max_prompt_chunk"])


def test_mel_is_the_official_one(detok, golden, voice_meta):
    """Settings read from vocoder/config.json, as the golden's meta records them."""
    mel_meta = voice_meta["mel"]
    assert {k: getattr(detok.mel, k) for k in mel_meta} == {
        k: (float(v) if k == "fmin" else v) for k, v in mel_meta.items()
    }
    mel = detok.mel(golden["voice.ref_wav24k"])
    assert mel.shape == golden["voice.ref_mel"].shape
    torch.testing.assert_close(mel, golden["voice.ref_mel"], **TOL)


def test_prefill_split_is_the_official_one():
    assert prefill_spans(172) == [(0, 22), (22, 172)]
    assert prefill_spans(300) == [(0, 150), (150, 300)]  # no empty rest call
    assert prefill_spans(100) == [(0, 100)]
    assert prefill_spans(2000, max_chunks=10) == [(0, 500)] + [(500 + 150 * i, 650 + 150 * i) for i in range(10)]


def test_stream_after_prefill_matches_official(detok, golden, voice_meta):
    """The official prefill then detokenize_audio's chunking: every chunk's positions, mel and
    wav, and the whole reply, within the golden's tolerance."""
    assert torch.equal(golden["voice.ref_ids"][0], golden["voice.ref_codes"][0].repeat_interleave(4))
    calls = detok.num_prefill_calls
    voice = golden_voice(detok, golden, voice_meta)
    frames = voice_meta["ref_ids_frames"]
    assert detok.num_prefill_calls - calls == len(
        prefill_spans(frames, PROMPT_CHUNK_FRAMES, voice_meta["max_prompt_chunk"])
    )
    assert voice.next_position == voice_meta["start_position_after_prefill"]
    info = golden["voice.chunk_info"]
    noises = iter(golden[f"voice.chunk{i}.noise"] for i in range(info.shape[0]))
    trace = []
    wav = detok.detokenize(golden["voice.tokens"], noise_fn=lambda n: next(noises), trace=trace, voice=voice)
    assert len(trace) == info.shape[0]
    for i, rec in enumerate(trace):
        row = [
            rec["start_position"],
            rec["n_frames_in"],
            rec["look_ahead"],
            int(rec["is_final"]),
            rec["mel"].shape[0],
            rec["wav"].numel(),
        ]
        assert row == info[i].tolist(), f"chunk {i}"
        assert rec["prefix_frames"] >= min(frames, detok.schedule.max_kv_cache_frames)  # attends to the voice
        assert torch.equal(rec["semantic_tokens"], golden[f"voice.chunk{i}.semantic_tokens"])
        torch.testing.assert_close(rec["mel"], golden[f"voice.chunk{i}.mel"], **TOL)
        torch.testing.assert_close(rec["wav"], golden[f"voice.chunk{i}.wav"][0], **TOL)
    torch.testing.assert_close(wav, golden["voice.wav"][0], **TOL)
    # without the voice the same noise gives other speech: the prefix is really attended to
    noises = iter(golden[f"voice.chunk{i}.noise"] for i in range(info.shape[0]))
    plain = detok.detokenize(golden["voice.tokens"], noise_fn=lambda n: next(noises))
    assert (plain - golden["voice.wav"][0]).abs().max() > 1e-2


def test_position_reset_returns_to_the_voice(fast, golden, voice_meta):
    """When positions run out, the stream restarts at the voice prefix (the official backup),
    not at 0 with an empty K/V; a new stream after a final chunk starts there too."""
    voice = golden_voice(fast, golden, voice_meta)
    params = dataclasses.replace(fast.new_stream().params, max_position=voice.next_position + 160)
    stream = DetokStream(params, seed=1, voice=voice)
    stream.trace = []
    assert stream.start_position == voice.next_position and stream.kv is voice.kv
    tokens = random_tokens(fast, 80, torch.Generator().manual_seed(2))
    restarts = 0
    for i in range(0, 80, 4):
        fast.step_batch([(stream, tokens[i : i + 4], False)])
        if stream.is_started and stream.start_position == voice.next_position:
            restarts += 1
            assert stream.kv is voice.kv  # the shared prefix itself, untouched by the chunks before
    assert restarts, "positions never ran out: the test's limit is too generous"
    starts = [rec["start_position"] for rec in stream.trace]
    assert starts[0] == voice.next_position and min(starts) == voice.next_position and max(starts) > voice.next_position
    assert all(rec["prefix_frames"] >= voice.frames for rec in stream.trace)  # the voice is never dropped
    fast.step_batch([(stream, [], True)])  # final: the next stream starts from the voice again
    assert not stream.is_started and stream.start_position == voice.next_position and stream.kv is voice.kv


def test_streams_in_different_voices_batch_like_alone(fast, golden, voice_meta):
    """Bucketed batches (padded rows, frames and prefixes of different lengths, as on CUDA) of
    streams in two voices and none equal each stream run alone at its own shapes."""
    wav, codes = golden["voice.ref_wav24k"], golden["voice.ref_codes"][0]
    voices = [
        golden_voice(fast, golden, voice_meta),
        fast.voice_prefix(wav[: wav.numel() // 2].flip(0), codes[:20].flip(0)),
        None,
    ]
    assert voices[0].frames != voices[1].frames
    bucketed = Detokenizer(fast.dit, fast.vocoder, fast.cfg, bucketed=True, mel=fast.mel)
    g = torch.Generator().manual_seed(4)
    plans = [(voices[i % 3], 10 + i, random_tokens(fast, 20 + 9 * i, g)) for i in range(5)]

    def drive(detok, together):
        streams = [detok.new_stream(seed, voice=v) for v, seed, _ in plans]
        out = [[] for _ in plans]
        for step in range(3):
            items = [(s, toks[step * 12 : (step + 1) * 12], step == 2) for s, (_, _, toks) in zip(streams, plans)]
            wavs = detok.step_batch(items) if together else [detok.step_batch([item])[0] for item in items]
            for i, w in enumerate(wavs):
                out[i].append(w)
        return out

    alone, batched = drive(fast, False), drive(bucketed, True)
    for a, b in zip(alone, batched):
        assert [w.numel() for w in a] == [w.numel() for w in b]
        torch.testing.assert_close(torch.cat(b), torch.cat(a), **TOL)
    # the voice matters: the same seed and tokens in another voice sound different
    v0 = fast.detokenize(plans[0][2], seed=5, voice=voices[0])
    v1 = fast.detokenize(plans[0][2], seed=5, voice=voices[1])
    assert (v0 - v1).abs().max() > 1e-2


def test_bad_voice_prompts(fast, golden):
    wav = golden["voice.ref_wav24k"]
    with pytest.raises(KimiAudioError, match="at least one"):
        fast.voice_prefix(wav, [])
    with pytest.raises(KimiAudioError, match="out of range"):
        fast.voice_prefix(wav, [fast.dit.cfg.semantic_vocab_size])
    with pytest.raises(KimiAudioError, match="positions"):
        fast.voice_prefix(wav, [0] * 1100)
    with pytest.raises(KimiAudioError, match="too short"):
        fast.voice_prefix(wav[:100], [0])
