"""The streaming state machine against a plain transcription of the official batch-1 code.

The goldens cover two or three chunks; this reference (official detokenize_audio ->
detokenize_streaming -> infer_chunk -> torchdyn Euler, written out with plain tensors, one
stream, K/V grown by cat) also covers the K/V cap (max_kv_cache_tokens) and the position reset
(max_pos_size), shrunk here to 100 frames and 400 positions so that a few chunks reach them.
"""

from dataclasses import replace

import torch

from kimiaudio.config import DetokConfig
from kimiaudio.config.chunk_schedule import UPSAMPLE
from kimiaudio.detok.detokenizer import Detokenizer
from kimiaudio.detok.flow_matching import REFRESH_T
from kimiaudio.detok.streaming import DetokStream
from kimiaudio.models.dit import DiTContext

MAX_KV, MAX_POS, STEPS = 100, 400, 4


def _context(dit, ids, positions, prev):
    """Batch-1 DiT inputs, nothing padded: K/V buffers [1, heads, p + n, head_dim] per block
    holding the prefix `prev` [depth, 2, heads, p, head_dim]."""
    p, n = 0 if prev is None else prev.shape[3], len(ids)
    heads, hd = dit.kv_shape
    kv = torch.zeros(dit.cfg.depth, 2, 1, heads, p + n, hd)
    if prev is not None:
        kv[:, :, 0, :, :p] = prev
    pos_emb, rope = dit.position_inputs(positions[None])
    ctx = DiTContext(
        dit.semantic_token_embedding(ids[None]),
        pos_emb,
        rope,
        list(kv[:, 0]),
        list(kv[:, 1]),
        p,
        torch.ones(1, 1, 1, p + n, dtype=torch.bool),
    )
    return ctx, lambda: kv[:, :, 0, :, p:].clone()  # the last call's chunk K/V


def _euler(dit, x, ids, positions, prev, steps):
    """torchdyn 1.0.6 fixed-step Euler over linspace(0, 1, steps); K/V of the last call."""
    ctx, chunk_kv = _context(dit, ids, positions, prev)
    t_span = torch.linspace(0, 1, steps)
    t, dt = t_span[0], t_span[1] - t_span[0]
    for k in range(1, steps):
        v = dit(x, (t * 1000).long().view(1), ctx)
        x = x + dt * v
        t = t + dt
        if k < steps - 1:
            dt = t_span[k + 1] - t
    return x, chunk_kv()


def _reference(dit, vocoder, tokens, noises, first, chunk, look_ahead):
    """The wav pieces and each chunk's start position."""
    hop = vocoder.cfg.hop_size
    pieces, starts, start, prev, left, pre_mel, pre_wav = [], [], 0, None, None, None, None
    chunks = [(tokens[:first], len(tokens) <= first)]
    rest = tokens[first:]
    chunks += [(rest[i : i + chunk], i + chunk >= len(rest)) for i in range(0, len(rest), chunk)]
    for toks, final in chunks:
        ids = torch.tensor(toks).repeat_interleave(UPSAMPLE)
        if left is not None:
            ids = torch.cat([left, ids])
        x0 = next(noises)[None]
        starts.append(start)
        positions = torch.arange(start, start + len(ids))
        x, cur = _euler(dit, x0, ids, positions, prev, STEPS)
        la = 0 if final else look_ahead * UPSAMPLE
        if la:
            left, mel = ids[-la:], x[0, :-la]
            ctx, chunk_kv = _context(dit, ids[:-la], positions[:-la], prev)
            dit(mel[None], (torch.tensor([REFRESH_T]) * 1000).long(), ctx)
            cur = chunk_kv()
        else:
            mel = x[0]
        if dit.cfg.normalize_mel:  # the DiT works on normalised mels; infer_chunk returns them undone
            mel = mel * dit.cfg.mel_std + dit.cfg.mel_mean
        prev = cur if prev is None else torch.cat([prev, cur], dim=3)
        if prev.shape[3] > MAX_KV:
            prev = prev[:, :, :, -MAX_KV:]
        c = mel.shape[0]
        start += c
        if pre_mel is None:
            wav = vocoder(mel.T[None])[0, 0]
            if final:
                out = wav
            else:
                out, pre_wav, pre_mel = wav[: hop * c // 2], wav[-(hop * c // 2) :], mel[-c // 2 :]
        else:
            wav = vocoder(torch.cat([pre_mel, mel]).T[None])[0, 0]
            if final:
                out = wav
            else:
                held = pre_wav.shape[0]
                gen = held * 2 if wav.shape[0] > held * 2 else wav.shape[0] // 2
                out = wav[:gen].clone()
                w = torch.hamming_window(gen)
                out[: gen // 2] = pre_wav[: gen // 2] * w[-(gen // 2) :] + out[: gen // 2] * w[: gen // 2]
                res = wav.shape[0] - gen
                pre_wav, pre_mel = wav[-res:], mel[-(res // hop) :]
        pieces.append(out)
        if not final and start + 2 * c > MAX_POS:
            start, prev = 0, None
    return pieces, starts


@torch.inference_mode()
def test_kv_cap_and_position_reset_match_reference(golden_paths):
    # The official chunking (every chunk 30 tokens, 12 look-ahead) with a few ODE steps.
    config = DetokConfig(
        first_chunk_tokens=30,
        first_look_ahead_tokens=12,
        first_ode_steps=STEPS,
        chunk_tokens=30,
        chunk_growth=1.0,
        max_chunk_tokens=30,
        look_ahead_tokens=12,
        ode_steps=STEPS,
        min_ode_steps=STEPS,
    )
    detok = Detokenizer.load(golden_paths, "cpu", torch.float32, config)
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, detok.dit.cfg.semantic_vocab_size, (100,), generator=g).tolist()
    noises = []  # drawn as the stream asks for them, replayed to the reference

    def noise(frames: int) -> torch.Tensor:
        noises.append(torch.randn(frames, detok.dit.cfg.input_size, generator=g))
        return noises[-1]

    params = detok.new_stream().params
    params = replace(params, schedule=replace(params.schedule, max_kv_cache_frames=MAX_KV), max_position=MAX_POS)
    stream = DetokStream(params, noise_fn=noise)
    stream.trace = []
    got = [detok.step_batch([(stream, tokens[i : i + 10], False)])[0] for i in range(0, 100, 10)]
    got.append(detok.step_batch([(stream, [], True)])[0])
    expected, expected_starts = _reference(
        detok.dit,
        detok.vocoder,
        tokens,
        iter(noises),
        config.first_chunk_tokens,
        config.chunk_tokens,
        config.look_ahead_tokens,
    )
    starts = [rec["start_position"] for rec in stream.trace]
    assert starts == expected_starts and 0 in starts[1:]  # positions were reset at least once
    got = [w for w in got if w.numel()]
    assert len(got) == len(expected) == len(starts)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
