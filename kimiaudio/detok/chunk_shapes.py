"""The shapes a stream of chunks will have, found by running a stream's own bookkeeping.

Before serving, the detokenizer captures a CUDA graph for every shape it expects: the DiT's
(frames, cached prefix) of each chunk and the mel length each vocoder call gets (the official
overlap makes it vary from chunk to chunk). Rather than re-deriving the streaming rules, this
drives a DetokStream (detok/streaming.py) with stand-in model outputs of the right lengths:
the same code that serves decides the shapes, K/V cap and position resets included.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kimiaudio.detok.flow_matching import ChunkOutput
from kimiaudio.detok.streaming import DetokStream, StreamParams


@dataclass(frozen=True)
class ChunkShape:
    frames: int  # DiT frames of the chunk (carried look-ahead included)
    prefix: int  # cached K/V frames it attends to
    vocoder_frames: int  # mel frames of its vocoder call (held mel included)


def rehearse(params: StreamParams, chunks: int = 120) -> list[ChunkShape]:
    """The shapes of the first `chunks` (non-final) chunks of one long stream: 120 reach the
    K/V cap with the usual schedules (and Buckets.serving_shapes adds the longest chunks at
    every prefix, which a position restart or a short stream may bring)."""
    stream = DetokStream(params, seed=0, noise_fn=lambda n: torch.zeros(n, 1))
    stream.push([0] * sum(params.schedule.tokens(i) for i in range(chunks)))
    shapes = []
    for _ in range(chunks):
        job = stream.next_job(final=False)
        kept = job.token_ids.numel() - job.look_ahead
        kv = torch.zeros(1, 1, 1, kept, 1)  # only the frame count matters to the bookkeeping
        mel = stream.finish_dit(ChunkOutput(torch.zeros(kept, 1), kv))
        stream.finish_vocoder(torch.zeros(mel.shape[0] * params.hop_size))
        shapes.append(ChunkShape(job.token_ids.numel(), job.prefix_frames, mel.shape[0]))
    return shapes
