"""Resampling mono float32 audio with FFmpeg's libswresample (PyAV's `av.AudioResampler`):
one-shot (`resample`) and for streams of chunks (`StreamResampler`, e.g. 48 kHz WebRTC frames ->
16 kHz, 24 kHz speech -> 48 kHz), where chunk boundaries are seamless because one resampler
keeps its filter state.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from kimiaudio.errors import AudioInputError


class StreamResampler:
    """Resample a stream of mono float32 chunks; `push` returns what is ready (delay ~16 samples).

    The concatenation of every `push` output and the final `flush` equals the one-shot
    `resample` of the whole signal.
    """

    def __init__(self, from_sr: int, to_sr: int):
        import av

        if from_sr <= 0 or to_sr <= 0:
            raise AudioInputError(f"sample rates must be positive (got {from_sr} -> {to_sr})")
        self.from_sr = int(from_sr)
        self.to_sr = int(to_sr)
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=self.to_sr)
        self._num_samples_in = 0  # running pts of the input, in input samples

    def push(self, pcm: np.ndarray) -> np.ndarray:
        import av

        pcm = as_mono_float32(pcm)
        if pcm.size == 0:
            return np.zeros(0, dtype=np.float32)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm[None, :]), format="flt", layout="mono")
        frame.sample_rate = self.from_sr
        frame.time_base = Fraction(1, self.from_sr)
        frame.pts = self._num_samples_in
        self._num_samples_in += pcm.size
        return _frames_to_pcm(self._resampler.resample(frame))

    def flush(self) -> np.ndarray:
        """The samples still held in the filter; the resampler cannot be used afterwards."""
        return _frames_to_pcm(self._resampler.resample(None))


def resample(pcm: np.ndarray, from_sr: int, to_sr: int) -> np.ndarray:
    """One-shot resampling of a mono float32 signal (a copy when the rates are equal)."""
    pcm = as_mono_float32(pcm)
    if from_sr == to_sr:
        return pcm.copy()
    stream = StreamResampler(from_sr, to_sr)
    return np.concatenate([stream.push(pcm), stream.flush()])


def _frames_to_pcm(frames) -> np.ndarray:
    if not frames:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32, copy=False)


def as_mono_float32(pcm: np.ndarray) -> np.ndarray:
    pcm = np.asarray(pcm, dtype=np.float32)
    if pcm.ndim != 1:
        raise AudioInputError(f"expected mono audio as a 1-D array, got shape {pcm.shape}")
    return pcm
