"""Bucket shapes of the batched DiT (pure bookkeeping, no model)."""

import pytest
import torch

from kimiaudio.config import DetokConfig
from kimiaudio.detok.buckets import BucketShape, Buckets, stream_shapes
from kimiaudio.detok.flow_matching import ChunkOutput
from kimiaudio.detok.settings import ChunkSchedule
from kimiaudio.detok.streaming import DetokSession, StreamParams


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
    shapes = buckets.serving_shapes(schedule, 4096)
    pairs = {(s.frames, s.prefix) for s in shapes}
    for n, p in stream_shapes(schedule, 4096):
        assert (buckets.shape(1, n, p).frames, buckets.shape(1, n, p).prefix) in pairs
    assert {(176, p) for p in buckets.prefix_sizes} <= pairs
    assert {s.rows for s in shapes} == {1, 2, 4} and len(shapes) == 3 * len(pairs)


def _drive(session: DetokSession, steps: int, kv_shape=(1, 2, 1, 0, 1)):
    """Run the session's bookkeeping with stand-in model outputs: (frames, prefix) per chunk."""
    seen = []
    session.push([1] * 4000)
    for _ in range(steps):
        job = session.next_job(False)
        seen.append((job.token_ids.numel(), job.prefix_frames))
        kept = job.token_ids.numel() - job.look_ahead
        kv = torch.zeros(*kv_shape[:3], kept, kv_shape[4])
        mel = session.finish_dit(ChunkOutput(torch.zeros(kept, 2), kv))
        session.finish_vocoder(torch.zeros(mel.shape[0] * 3))
    return seen


@pytest.mark.parametrize("preset", ["official", "low_latency"])
def test_stream_shapes_follow_the_session(preset):
    """The planned shapes are the ones a session produces, K/V cap and position reset included."""
    schedule = ChunkSchedule.from_config(DetokConfig(preset=preset, max_kv_cache_frames=900), 1000)
    session = DetokSession(StreamParams(schedule, mel_bins=2, hop_size=3, vocab_size=8, max_position=1000), seed=0)
    seen = _drive(session, 40)
    assert seen == stream_shapes(schedule, 1000, chunks=40)
    assert (seen[0][1], min(p for _, p in seen[1:])) == (0, 0)  # positions were reset along the way
