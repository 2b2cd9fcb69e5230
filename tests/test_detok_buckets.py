"""Bucket shapes of the batched DiT and the rehearsal that plans them."""

import pytest
import torch

from kimiaudio.checkpoint.paths import find_checkpoint
from kimiaudio.config import DetokConfig
from kimiaudio.config.chunk_schedule import ChunkSchedule
from kimiaudio.detok.buckets import Buckets, BucketShape
from kimiaudio.detok.chunk_shapes import rehearse
from kimiaudio.detok.detokenizer import Detokenizer
from kimiaudio.detok.streaming import StreamParams


def test_default_buckets():
    schedule = ChunkSchedule.from_config(DetokConfig(), 4096)
    buckets = Buckets.for_schedule(schedule, 16)
    assert buckets.batch_sizes == (1, 2, 4, 8, 16)
    # chunks of 8 (first), 2+8, 4+12, 4+18, 4+27, 4+40 tokens -> frames rounded up to 16
    assert buckets.frame_sizes == (32, 48, 64, 96, 128, 176)
    assert buckets.prefix_sizes == (0, 256, 512, 768, 912)
    assert buckets.shape(3, 40, 0) == BucketShape(4, 48, 0)
    assert buckets.shape(9, 170, 300) == BucketShape(16, 176, 512)
    assert buckets.shape(1, 200, 5) == BucketShape(1, 208, 256)  # beyond the plan: its own aligned shape
    assert Buckets.for_schedule(schedule, 12).batch_sizes == (1, 2, 4, 8, 12)
    exact = Buckets.for_schedule(schedule, 16, exact=True)
    assert exact.shape(3, 41, 7) == BucketShape(3, 41, 7)
    with pytest.raises(ValueError, match="at most 16"):
        buckets.shape(17, 32, 0)


def test_serving_shapes_cover_every_stream_chunk():
    schedule = ChunkSchedule.from_config(DetokConfig(), 4096)
    buckets = Buckets.for_schedule(schedule, 4)
    stream = [(c.frames, c.prefix) for c in rehearse(_params(schedule, 4096))]
    shapes = buckets.serving_shapes(stream)
    pairs = {(s.frames, s.prefix) for s in shapes}
    for n, p in stream:
        assert (buckets.shape(1, n, p).frames, buckets.shape(1, n, p).prefix) in pairs
    assert {(176, p) for p in buckets.prefix_sizes} <= pairs
    assert {s.rows for s in shapes} == {1, 2, 4} and len(shapes) == 3 * len(pairs)


def _params(schedule, max_position):
    return StreamParams(schedule, mel_bins=80, hop_size=480, vocab_size=64, max_position=max_position)


@pytest.mark.parametrize("preset", ["official", "low_latency"])
def test_rehearsal_restarts_positions(preset):
    schedule = ChunkSchedule.from_config(DetokConfig(preset=preset), 1000)
    shapes = rehearse(_params(schedule, 1000), chunks=40)
    assert shapes[0].prefix == 0 and min(c.prefix for c in shapes[1:]) == 0  # restarted along the way
    assert max(c.prefix for c in shapes) <= schedule.max_kv_cache_frames


@torch.inference_mode()
def test_rehearsal_shapes_are_the_real_ones(golden_checkpoint):
    """A real stream's DiT shapes (frames, prefix) and vocoder lengths, chunk by chunk, are the
    rehearsed ones (the final chunk aside)."""
    cfg = DetokConfig(first_ode_steps=2, ode_steps=2, min_ode_steps=2, max_kv_cache_frames=100)
    detok = Detokenizer.load(find_checkpoint(golden_checkpoint), "cpu", torch.float32, cfg)
    lengths = []
    hook = detok.vocoder.register_forward_hook(lambda m, args, out: lengths.append(args[0].shape[2]))
    trace = []
    detok.detokenize(torch.randint(0, 64, (230,)).tolist(), seed=0, trace=trace)
    hook.remove()
    shapes = rehearse(detok.new_stream().params, chunks=len(trace) - 1)
    assert [(c.frames, c.prefix, c.vocoder_frames) for c in shapes] == [
        (r["n_frames_in"], r["prefix_frames"], n) for r, n in zip(trace[:-1], lengths)
    ]
    assert max(c.prefix for c in shapes) == 100
