"""Streaming detokenizer: official detokenize_audio goldens (preset "official"), the low-latency
chunk schedule, batched streams == alone, RTF."""

import pytest
import torch

from kimiaudio.config import DetokConfig
from kimiaudio.config.chunk_schedule import ChunkSchedule
from kimiaudio.detok.detokenizer import Detokenizer, DetokItem
from kimiaudio.detok.flow_matching import REFRESH_T, euler_schedule
from kimiaudio.errors import ConfigError, KimiAudioError

from helpers.detok_reference import TOL, random_tokens, streamed_samples


def mel_frames_per_token(meta: dict) -> int:
    return meta["sections"]["detok"]["upsample_factor"]


@pytest.fixture(scope="module")
def fast(detok):
    """Same weights, the low-latency preset with fewer ODE steps: for tests that compare the
    code with itself (first chunks of 8 tokens, later ones of 8, 12, 18, ... up to 40)."""
    return Detokenizer(detok.dit, detok.vocoder, DetokConfig(ode_steps=6, first_ode_steps=4, min_ode_steps=3))


@pytest.mark.parametrize("name, low_latency_config", [("s37", False), ("s75", False), ("s75", True)])
def test_detokenize_matches_official(golden, golden_meta, detok, fast, name, low_latency_config):
    """The golden's chunking reproduces the official streaming; so does detokenize(preset=
    "official") on a detokenizer configured for low latency."""
    steps = golden_meta["sections"]["detok"]["ode_steps"]
    info = golden[f"detok.{name}.chunk_info"]
    captured = iter(golden[f"detok.{name}.chunk{i}.noise"] for i in range(info.shape[0]))
    trace = []
    tokens = golden[f"detok.{name}.tokens"]
    if low_latency_config:
        wav = fast.detokenize(tokens, noise_fn=lambda n: next(captured), trace=trace, preset="official")
    else:
        wav = detok.detokenize(tokens, noise_fn=lambda n: next(captured), trace=trace)
    assert len(trace) == info.shape[0]
    ode_t = []
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
        assert torch.equal(rec["semantic_tokens"], golden[f"detok.{name}.chunk{i}.semantic_tokens"])
        torch.testing.assert_close(rec["mel"], golden[f"detok.{name}.chunk{i}.mel"], **TOL)
        torch.testing.assert_close(rec["wav"], golden[f"detok.{name}.chunk{i}.wav"][0], **TOL)
        assert rec["ode_steps"] == steps
        ode_t += euler_schedule(steps)[0].tolist() + ([REFRESH_T] if rec["look_ahead"] else [])
    torch.testing.assert_close(torch.tensor(ode_t), golden[f"detok.{name}.ode_t"], atol=0, rtol=0)
    assert wav.dtype == torch.float32 and wav.device.type == "cpu"
    torch.testing.assert_close(wav, golden[f"detok.{name}.wav"][0], **TOL)


def _drive(detok, plans, together: bool, traces: list[list] | None = None):
    """plans: per stream (seed, {step: (tokens, final)}). Returns per stream the per-step wavs;
    `traces`: one list per stream, given each stream's chunk records."""
    streams = [detok.new_stream(seed) for seed, _ in plans]
    for stream, trace in zip(streams, traces or []):
        stream.trace = trace
    steps = max(max(p) for _, p in plans) + 1
    out = [[] for _ in plans]
    for step in range(steps):
        items = [(i, streams[i], *plan[step]) for i, (_, plan) in enumerate(plans) if step in plan]
        if together:
            wavs = detok.step_batch([(s, toks, final) for _, s, toks, final in items])
        else:
            wavs = [detok.step_batch([(s, toks, final)])[0] for _, s, toks, final in items]
        for (i, *_), wav in zip(items, wavs):
            out[i].append(wav)
    return out


def test_batched_streams_equal_alone(fast, golden_checkpoint, golden_meta):
    """Streams batched at padded bucket shapes (as on CUDA) equal each stream run alone at its
    own shapes (as on the CPU)."""
    detok = fast
    bucketed = Detokenizer(detok.dit, detok.vocoder, detok.cfg, bucketed=True)
    assert bucketed.buckets.frame_sizes[0] == 32 and bucketed.vocoders.padded and not detok.vocoders.padded
    calls = []
    hook = detok.vocoder.register_forward_hook(lambda m, args, out: calls.append(args[0].shape[0]))
    g = torch.Generator().manual_seed(3)
    toks = lambda n: random_tokens(detok, n, g)  # noqa: E731
    plans = [  # streams of different lengths, staggered: first, later and final chunks mix
        (11, {0: (toks(31), False), 1: (toks(30), False), 2: (toks(4), True)}),
        (22, {1: (toks(10), False), 2: (toks(25), False), 3: (toks(0), True)}),
        (33, {1: (toks(33), True)}),
        (44, {1: (toks(33), True)}),  # same shapes as the previous one: they share vocoder forwards
        (55, {2: (toks(20), True)}),
        (66, {2: (toks(6), True)}),  # a first chunk that is also the final one
    ]
    traces = [[] for _ in plans]
    alone = _drive(detok, plans, together=False, traces=traces)
    calls.clear()
    batched = _drive(bucketed, plans, together=True)
    hook.remove()
    assert max(calls) >= 2  # equal mel lengths were vocoded together
    for a, b, (_, plan), trace in zip(alone, batched, plans, traces):
        assert [w.numel() for w in a] == [w.numel() for w in b]
        for wa, wb in zip(a, b):
            torch.testing.assert_close(wb, wa, **TOL)
        # every code became mel frames, and the frames the samples the vocoder makes of them
        tokens = sum(len(t) for t, _ in plan.values())
        assert sum(r["mel"].shape[0] for r in trace) == tokens * mel_frames_per_token(golden_meta)
        assert sum(w.numel() for w in a) == streamed_samples(golden_checkpoint, trace)


def test_streaming_stream_equals_offline(fast):
    detok = fast
    """Pushing tokens bit by bit with official chunk sizes gives detokenize's wav."""
    tokens = random_tokens(detok, 45, torch.Generator().manual_seed(5))
    stream = detok.new_stream(seed=9)
    pieces = [detok.step_batch([(stream, tokens[i : i + 7], False)])[0] for i in range(0, 42, 7)]
    pieces.append(detok.step_batch([(stream, tokens[42:], True)])[0])
    torch.testing.assert_close(torch.cat(pieces), detok.detokenize(tokens, seed=9), **TOL)
    assert not stream.ready(True)  # the final chunk reset the stream


def test_a_stream_holds_its_prefix_and_overlap_between_chunks(fast):
    """held_bytes (what the pipeline's metrics add up against the memory plan's detokenizer
    state): the prefix K/V and the mel and wav carried to the next chunk, within the plan's
    figure for one stream; nothing once the final chunk has reset the stream."""
    detok = fast
    tokens = random_tokens(detok, 45, torch.Generator().manual_seed(5))
    stream = detok.new_stream(seed=9)
    held = []
    for i in range(0, 42, 7):
        detok.step_batch([(stream, tokens[i : i + 7], False)])
        parts = [stream.kv, stream.pre_mel, stream.pre_wav, stream._mel]
        assert stream.held_bytes() == sum(t.numel() * t.element_size() for t in parts if t is not None)
        held.append(stream.held_bytes())
    assert 0 < max(held) <= detok.state_bytes_per_stream() and stream.kv is not None
    detok.step_batch([(stream, tokens[42:], True)])
    assert stream.held_bytes() == 0


def test_bad_inputs(detok):
    with pytest.raises(KimiAudioError, match="out of range"):
        detok.new_stream(0).push([detok.dit.cfg.semantic_vocab_size])
    s = detok.new_stream(0)
    with pytest.raises(KimiAudioError, match="twice"):
        detok.step_batch([(s, [1], False), (s, [2], False)])
    with pytest.raises(ConfigError, match="detok.first_chunk_tokens"):
        Detokenizer(detok.dit, detok.vocoder, DetokConfig(first_chunk_tokens=DetokConfig().first_look_ahead_tokens))
    assert detok.detokenize([]).numel() == 0


def test_every_code_becomes_audio(detok, golden_checkpoint, golden_meta):
    """detokenize of 50 codes (4 s): every code becomes mel frames, and the frames the samples
    the checkpoint's vocoder makes of them, streamed (the speed is the benches' to report)."""
    tokens = random_tokens(detok, 50, torch.Generator().manual_seed(1))
    trace = []
    wav = detok.detokenize(tokens, seed=0, trace=trace)
    assert sum(r["mel"].shape[0] for r in trace) == len(tokens) * mel_frames_per_token(golden_meta)
    assert wav.numel() == sum(r["wav"].numel() for r in trace) == streamed_samples(golden_checkpoint, trace)
    assert bool(torch.isfinite(wav).all()) and wav.abs().max() > 0


def test_low_latency_schedule_is_what_the_config_says(fast, golden_checkpoint):
    """First chunk: 8 tokens, 2 look-ahead, 4 ODE points; then 8, 12, 18, 27, 40, 40 tokens with
    4 look-ahead (carried into the next chunk) and 6 points; a final chunk takes the rest."""
    tokens = random_tokens(fast, 150, torch.Generator().manual_seed(2))
    trace = []
    wav = fast.detokenize(tokens, seed=1, trace=trace)
    sizes = [8, 8, 12, 18, 27, 40, 37]
    assert sum(sizes) == len(tokens)
    carried = [0, 2, 4, 4, 4, 4, 4]
    look_ahead = [2, 4, 4, 4, 4, 4, 0]
    assert [r["n_frames_in"] for r in trace] == [4 * (c + n) for c, n in zip(carried, sizes)]
    assert [r["look_ahead"] for r in trace] == [4 * la for la in look_ahead]
    assert [r["ode_steps"] for r in trace] == [4, 6, 6, 6, 6, 6, 6]
    assert [r["start_position"] for r in trace] == [0, 24, 48, 96, 168, 276, 436]
    assert wav.numel() == streamed_samples(golden_checkpoint, trace)


@pytest.mark.parametrize(
    "change, key",
    [
        (dict(preset="fast"), "detok.preset"),
        (dict(min_ode_steps=20), "detok.min_ode_steps"),
        (dict(first_ode_steps=1), "detok.first_ode_steps"),
        (dict(first_look_ahead_tokens=-1), "detok.first_look_ahead_tokens"),
        (dict(first_look_ahead_tokens=0, chunk_tokens=4, look_ahead_tokens=4), "detok.chunk_tokens"),
        (dict(max_chunk_tokens=4), "detok.max_chunk_tokens"),
        (dict(chunk_growth=0.5), "detok.chunk_growth"),
        (dict(max_chunk_tokens=2000), "detok.max_chunk_tokens"),
        (dict(max_kv_cache_frames=0), "detok.max_kv_cache_frames"),
    ],
)
def test_schedule_errors_name_the_key(change, key):
    with pytest.raises(ConfigError, match=key):
        ChunkSchedule.from_config(DetokConfig(**change), 4096)
    # the official preset ignores the per-chunk values it replaces (each must still be in its range)
    if key in ("detok.min_ode_steps", "detok.chunk_tokens") or change == dict(max_chunk_tokens=4):
        official = ChunkSchedule.from_config(DetokConfig(preset="official", **change), 4096)
        assert (official.first_chunk_tokens, official.look_ahead_tokens, official.ode_steps) == (30, 12, 30)


def test_guard_steps_reach_the_chunks(fast):
    """DetokItem.ode_steps (the guard's choice) sets the steps of the chunks run in that call;
    step_batch feeds the cost estimate the guard forecasts with."""
    tokens = random_tokens(fast, 16, torch.Generator().manual_seed(8))
    seconds_per_frame = fast.vocoder.cfg.hop_size / fast.sample_rate
    stream = fast.new_stream(seed=0)
    stream.trace = []
    assert stream.next_chunk_seconds == pytest.approx((8 - 2) * 4 // 2 * seconds_per_frame)  # half held back
    fast.step_batch([DetokItem(stream, tokens[:8], False)])
    assert stream.next_chunk_seconds == pytest.approx(8 * 4 * seconds_per_frame)
    fast.step_batch([DetokItem(stream, tokens[8:], False, ode_steps=3)])
    assert [r["ode_steps"] for r in stream.trace] == [4, 3]
    assert fast.cost.seconds_per_call > 0
