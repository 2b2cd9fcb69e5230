"""The detokenizer's reference numbers: the golden's chunking, the vocoder's sample counts and
what a stream plays, from the checkpoint's files alone."""

import json
from collections.abc import Callable
from pathlib import Path

import torch

from kimiaudio.config import DetokConfig

TOL = dict(atol=1e-4, rtol=1e-4)


def official_detok_config(meta: dict) -> DetokConfig:
    """The chunking the golden was streamed with (official detokenize_audio), from its meta."""
    d = meta["sections"]["detok"]
    return DetokConfig(
        first_chunk_tokens=d["first_chunk_size"],
        first_look_ahead_tokens=d["look_ahead_tokens"],
        first_ode_steps=d["ode_steps"],
        chunk_tokens=d["chunk_size"],
        chunk_growth=1.0,
        max_chunk_tokens=d["chunk_size"],
        look_ahead_tokens=d["look_ahead_tokens"],
        ode_steps=d["ode_steps"],
        min_ode_steps=d["ode_steps"],
        max_kv_cache_frames=d["max_kv_cache_tokens"],
    )


def vocoder_samples(checkpoint: Path) -> Callable[[int], int]:
    """frames -> the samples the checkpoint's vocoder returns for a mel of that many frames,
    from its vocoder/config.json alone. Official BigVGAN upsamples with ConvTranspose1d(kernel
    k, stride u, padding (k - u) // 2), whose output length is (L - 1) * u - 2 * padding + k:
    L * u, plus one when k - u is odd (then more upsampling multiplies that sample); every
    other layer (kernel-7 convs padded by 3, the AMP blocks, 2x up/down filters) keeps L."""
    cfg = json.loads((checkpoint / "vocoder" / "config.json").read_text())
    layers = list(zip(cfg["upsample_rates"], cfg["upsample_kernel_sizes"], strict=True))

    def samples(frames: int) -> int:
        if frames == 0:
            return 0
        for stride, kernel in layers:
            frames = (frames - 1) * stride - 2 * ((kernel - stride) // 2) + kernel
        return frames

    return samples


def streamed_samples(checkpoint: Path, trace: list[dict]) -> int:
    """The samples a session's streams play, from the mel frames each chunk of its trace kept
    (every stream ending with its final chunk), as the official detokenize_streaming hands
    them out: the first chunk plays hop x half its frames and holds as many back (the tail of
    its wav; the second half of its mel is vocoded again with the next chunk); a later chunk
    plays twice the held samples (cross-faded) and holds the rest of its wav back (and of its
    mel, the frames that rest covers whole; all of them when that is none); the final chunk
    plays all it vocodes. Sizes from the checkpoint's vocoder/config.json."""
    vocode = vocoder_samples(checkpoint)
    hop = json.loads((checkpoint / "vocoder" / "config.json").read_text())["hop_size"]
    total, held, held_frames = 0, None, 0
    for rec in trace:
        frames = rec["mel"].shape[0]
        wav = vocode(held_frames + frames)
        if rec["is_final"]:
            total, held, held_frames = total + wav, None, 0
        elif held is None:
            held = hop * frames // 2
            total, held_frames = total + held, frames - frames // 2
        else:
            played = 2 * held if wav > 2 * held else wav // 2
            total, held = total + played, wav - played
            held_frames = frames if not 0 < held // hop <= frames else held // hop
    assert held is None, "a stream of the trace did not end"
    return total


def random_tokens(detok, n: int, generator: torch.Generator) -> list[int]:
    return torch.randint(0, detok.dit.cfg.semantic_vocab_size, (n,), generator=generator).tolist()
