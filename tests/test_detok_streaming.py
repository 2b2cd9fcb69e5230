"""Streaming detokenizer: official detokenize_audio goldens, batched sessions == alone, RTF."""

import time
import pytest
import torch

from kimiaudio.config import DetokConfig
from kimiaudio.detok.detokenizer import Detokenizer
from kimiaudio.detok.flow_matching import REFRESH_T
from kimiaudio.errors import ConfigError, KimiAudioError

TOL = dict(atol=1e-4, rtol=1e-4)


def official_detok_config(meta: dict) -> DetokConfig:
    """The chunking the golden was streamed with (official detokenize_audio), from its meta."""
    d = meta["sections"]["detok"]
    return DetokConfig(first_chunk_tokens=d["first_chunk_size"], chunk_tokens=d["chunk_size"],
                       max_chunk_tokens=d["chunk_size"], look_ahead_tokens=d["look_ahead_tokens"],
                       ode_steps=d["ode_steps"], max_kv_cache_frames=d["max_kv_cache_tokens"])


@pytest.fixture(scope="module")
def detok(golden_paths, golden_meta):
    return Detokenizer.load(golden_paths, "cpu", torch.float32, official_detok_config(golden_meta))


@pytest.fixture(scope="module")
def fast(detok):
    """Same weights, the project's default chunking, fewer ODE steps: for tests that compare
    the code with itself."""
    return Detokenizer(detok.dit, detok.vocoder, DetokConfig(ode_steps=8))


def random_tokens(detok, n: int, generator: torch.Generator) -> list[int]:
    return torch.randint(0, detok.dit.cfg.semantic_vocab_size, (n,), generator=generator).tolist()


@pytest.mark.parametrize("name", ["s37", "s75"])
def test_detokenize_matches_official(golden, detok, name):
    info = golden[f"detok.{name}.chunk_info"]
    captured = iter(golden[f"detok.{name}.chunk{i}.noise"] for i in range(info.shape[0]))
    trace = []
    wav = detok.detokenize(golden[f"detok.{name}.tokens"], noise_fn=lambda n: next(captured), trace=trace)
    assert len(trace) == info.shape[0]
    ode_t = []
    for i, rec in enumerate(trace):
        row = [rec["start_position"], rec["n_frames_in"], rec["look_ahead"], int(rec["is_final"]),
               rec["mel"].shape[0], rec["wav"].numel()]
        assert row == info[i].tolist(), f"chunk {i}"
        assert torch.equal(rec["semantic_tokens"], golden[f"detok.{name}.chunk{i}.semantic_tokens"])
        torch.testing.assert_close(rec["mel"], golden[f"detok.{name}.chunk{i}.mel"], **TOL)
        torch.testing.assert_close(rec["wav"], golden[f"detok.{name}.chunk{i}.wav"][0], **TOL)
        ode_t += list(detok.flow.schedule_t) + ([REFRESH_T] if rec["look_ahead"] else [])
    torch.testing.assert_close(torch.tensor(ode_t), golden[f"detok.{name}.ode_t"], atol=0, rtol=0)
    assert wav.dtype == torch.float32 and wav.device.type == "cpu"
    torch.testing.assert_close(wav, golden[f"detok.{name}.wav"][0], **TOL)


def _drive(detok, plans, together: bool):
    """plans: per session (seed, {step: (tokens, final)}). Returns per session the per-step wavs."""
    sessions = [detok.new_session(seed) for seed, _ in plans]
    steps = max(max(p) for _, p in plans) + 1
    out = [[] for _ in plans]
    for step in range(steps):
        items = [(i, sessions[i], *plan[step]) for i, (_, plan) in enumerate(plans) if step in plan]
        if together:
            wavs = detok.step_batch([(s, toks, final) for _, s, toks, final in items])
        else:
            wavs = [detok.step_batch([(s, toks, final)])[0] for _, s, toks, final in items]
        for (i, *_), wav in zip(items, wavs):
            out[i].append(wav)
    return out


def test_batched_sessions_equal_alone(fast):
    detok = fast
    calls = []
    hook = detok.vocoder.register_forward_hook(lambda m, args, out: calls.append(args[0].shape[0]))
    g = torch.Generator().manual_seed(3)
    toks = lambda n: random_tokens(detok, n, g)  # noqa: E731
    plans = [  # three sessions of different lengths, staggered; chunks of 120/168/final frames mix
        (11, {0: (toks(31), False), 1: (toks(30), False), 2: (toks(4), True)}),
        (22, {1: (toks(10), False), 2: (toks(25), False), 3: (toks(0), True)}),
        (33, {1: (toks(33), True)}),
        (44, {1: (toks(33), True)}),  # same shape as the previous one: they share a vocoder forward
        (55, {2: (toks(20), True)}),  # a first chunk that is also the final one
    ]
    alone = _drive(detok, plans, together=False)
    calls.clear()
    batched = _drive(detok, plans, together=True)
    hook.remove()
    assert max(calls) == 2  # equal mel lengths were vocoded together
    for a, b, (_, plan) in zip(alone, batched, plans):
        assert [w.numel() for w in a] == [w.numel() for w in b]
        for wa, wb in zip(a, b):
            torch.testing.assert_close(wb, wa, **TOL)
        assert sum(w.numel() for w in a) == sum(len(t) for t, _ in plan.values()) * detok.samples_per_token


def test_streaming_session_equals_offline(fast):
    detok = fast
    """Pushing tokens bit by bit with official chunk sizes gives detokenize's wav."""
    tokens = random_tokens(detok, 45, torch.Generator().manual_seed(5))
    session = detok.new_session(seed=9)
    pieces = [detok.step_batch([(session, tokens[i : i + 7], False)])[0] for i in range(0, 42, 7)]
    pieces.append(detok.step_batch([(session, tokens[42:], True)])[0])
    torch.testing.assert_close(torch.cat(pieces), detok.detokenize(tokens, seed=9), **TOL)
    assert not session.ready(True)  # the final chunk reset the session


def test_bad_inputs(detok):
    with pytest.raises(KimiAudioError, match="out of range"):
        detok.new_session(0).push([detok.dit.cfg.semantic_vocab_size])
    s = detok.new_session(0)
    with pytest.raises(KimiAudioError, match="twice"):
        detok.step_batch([(s, [1], False), (s, [2], False)])
    look_ahead = DetokConfig().look_ahead_tokens
    with pytest.raises(ConfigError, match="detok.first_chunk_tokens"):
        Detokenizer(detok.dit, detok.vocoder, DetokConfig(first_chunk_tokens=look_ahead))
    assert detok.detokenize([]).numel() == 0


def test_real_time_factor(detok):
    tokens = random_tokens(detok, 50, torch.Generator().manual_seed(1))  # 4 s
    start = time.perf_counter()
    wav = detok.detokenize(tokens, seed=0)
    elapsed = time.perf_counter() - start
    seconds = wav.numel() / detok.sample_rate
    print(f"\ndetokenize RTF on the tiny golden checkpoint (CPU, {torch.get_num_threads()} threads): "
          f"{elapsed:.3f} s for {seconds:.1f} s of audio = RTF {elapsed / seconds:.4f}")
