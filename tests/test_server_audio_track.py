"""The outgoing track (kimiaudio/server/transport/audio_track.py): 20 ms 48 kHz frames paced by pts,
24 kHz -> 48 kHz, jitter-buffer prebuffering, silence when idle, flush without pts jumps,
and the count of what was actually played."""

import numpy as np
import pytest

from kimiaudio.audio.resampling import resample
from kimiaudio.server.transport.audio_track import FRAME_SAMPLES, PlaybackTrack

from helpers.playback import ListenerLog


def _tone(seconds, sr=24000, freq=440.0):
    t = np.arange(int(seconds * sr)) / sr
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


async def _frames(track, n):
    out = []
    for _ in range(n):
        frame = await track.recv()
        out.append((frame.pts, frame.sample_rate, frame.to_ndarray().reshape(-1).astype(np.float32) / 32767))
    return out


class FakeTime:
    """A clock that moves only when the track sleeps (or a test says the loop stalled)."""

    def __init__(self):
        self.now, self.sleeps = 100.0, []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture(autouse=True)
def fake_time(monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(PlaybackTrack, "clock", staticmethod(fake.clock))
    monkeypatch.setattr(PlaybackTrack, "sleep", staticmethod(fake.sleep))
    return fake


async def test_idle_track_sends_paced_silence(fake_time):
    track = PlaybackTrack()
    frames = await _frames(track, 10)
    assert [pts for pts, _, _ in frames] == [i * FRAME_SAMPLES for i in range(10)]
    assert all(sr == 48000 and pcm.size == FRAME_SAMPLES and not pcm.any() for _, sr, pcm in frames)
    assert fake_time.sleeps == pytest.approx([0.02] * 9)  # nine 20 ms intervals
    # Frame n is due at start + n x 20 ms, not 20 ms after the last one was sent: time spent
    # between two calls comes off the next wait.
    fake_time.now += 0.015
    await track.recv()
    assert fake_time.sleeps[-1] == pytest.approx(0.005)
    # A stalled loop (far more than 100 ms late) re-anchors: the next frames are paced again
    # instead of sent in a burst to catch up.
    fake_time.now += 1.0
    await track.recv()
    waits = len(fake_time.sleeps)
    await _frames(track, 3)
    assert fake_time.sleeps[waits:] == pytest.approx([0.02] * 3)


async def test_response_is_resampled_and_played_in_order():
    listener = ListenerLog()
    track = PlaybackTrack(prebuffer_ms=40)
    pcm = _tone(0.3)
    track.begin("r1", listener)
    track.push(pcm[:3000])
    track.push(pcm[3000:])
    track.end()
    frames = await _frames(track, 20)  # 400 ms: the 300 ms response, then silence
    played = np.concatenate([p for _, _, p in frames])
    expected = resample(pcm, 24000, 48000)
    n = expected.size
    assert np.max(np.abs(played[:n] - expected)) < 2e-3  # only int16 rounding
    assert not played[n:].any()
    assert listener.calls == [("start", "r1"), ("end", "r1")]
    assert track.played_samples_24k == pytest.approx(pcm.size, abs=2)


async def test_prebuffer_waits_and_flush_keeps_pts_running():
    track = PlaybackTrack(prebuffer_ms=60)
    track.begin("r1", ListenerLog())
    track.push(_tone(0.02))  # 20 ms < 60 ms prebuffer, response not ended: wait
    frames = await _frames(track, 2)
    assert not frames[0][2].any() and not frames[1][2].any()
    track.push(_tone(1.0))
    frames += await _frames(track, 5)
    assert all(np.abs(p).max() > 0.3 for _, _, p in frames[2:])
    played = track.flush()
    assert played == 5 * FRAME_SAMPLES // 2  # 5 frames heard = 100 ms at 24 kHz
    frames += await _frames(track, 3)
    assert not any(p.any() for _, _, p in frames[7:])  # silence at once after the flush
    pts = [f[0] for f in frames]
    assert pts == [i * FRAME_SAMPLES for i in range(len(frames))]  # no jump, no restart


async def test_response_without_audio_finishes_without_starting():
    listener = ListenerLog()
    track = PlaybackTrack()
    track.begin("r1", listener)
    track.end()
    await _frames(track, 2)
    assert listener.calls == [("end", "r1")]
