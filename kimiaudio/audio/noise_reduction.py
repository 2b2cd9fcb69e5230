"""NoiseReduction: the user's 16 kHz speech with its steady background noise turned down, as it
streams (OpenAI's Realtime `audio.input.noise_reduction`, applied before the VAD and the model).

A short-time spectral gain: frames of FRAME samples (32 ms) at half-frame hops, square-root
Hann windows on analysis and synthesis (their product adds up to one at these hops, so a gain
of one gives the input back). The noise's power per frequency bin is the minimum of the
smoothed power over the last 1.5 s, times the ratio of a noise's mean power to that minimum
(minimum statistics, after Martin): speech, which comes and goes, leaves gaps at the noise's
level in every bin within a second or so, while a fan or a hum, which stays, is the minimum.
The gain is a Wiener gain on the decision-directed a priori SNR (Ephraim and Malah), floored
so that the noise is lowered, not removed: the floor keeps what is left of the noise natural
and spares the speech the warble of a deeper cut. OpenAI's two kinds differ in the floor:
`near_field` (a headset or handset: the noise is already well below the speech) lowers it by
up to 12 dB, `far_field` (a laptop or room microphone) by up to 20 dB.

Measured on espeak-ng speech (tests/test_noise_reduction.py checks the same kind of figures):
white noise at 10 dB SNR comes out at 12.8 dB (near_field), at 0 dB at 6.3 dB; a hum with
rumble at 5 dB at 11.9 dB; the noise alone is 9-12 dB lower (near_field) and 12-20 dB
(far_field); clean speech keeps its level within 0.2 dB.

Streaming: `push` takes the next chunk and returns what no later input can change, sample for
sample in step with the input but behind it by up to a frame (32 ms); `flush` returns the rest
(the input's end followed by silence) and starts the stream anew, keeping the noise estimate.
The output is the same however the input is cut into chunks, and as long as the input.
"""

from __future__ import annotations

import numpy as np

NOISE_REDUCTION_KINDS = ("near_field", "far_field")
FLOOR_DB = {"near_field": -12.0, "far_field": -20.0}
FRAME = 512  # 32 ms at 16 kHz
HOP = FRAME // 2
SMOOTHING = 0.7  # of the power whose minimum is the noise (per hop)
SUB_WINDOW = 12  # hops: the minimum is kept per sub-window of 192 ms ...
SUB_WINDOWS = 8  # ... over the last 8 (1.5 s): longer than a syllable, shorter than a change of room
MIN_BIAS = 3.0  # a noise's mean power over the minimum of its smoothed power (measured: white noise)
DECISION_DIRECTED = 0.98  # weight of the previous frame's clean-speech estimate in the a priori SNR
TINY = 1e-12


class NoiseReduction:
    def __init__(self, kind: str):
        if kind not in NOISE_REDUCTION_KINDS:
            raise ValueError(f"noise reduction {kind!r}: expected one of {', '.join(NOISE_REDUCTION_KINDS)}")
        self.kind = kind
        self._floor = 10.0 ** (FLOOR_DB[kind] / 20.0)
        self._window = np.sqrt(np.hanning(FRAME + 1)[:-1]).astype(np.float32)  # periodic
        # Per frequency bin, from the first frame on: the smoothed power, its minimum in the
        # current sub-window and in the last SUB_WINDOWS, and the last frame's clean-speech power.
        self._smoothed: np.ndarray | None = None
        self._window_min = np.zeros(0)
        self._minima: list[np.ndarray] = []
        self._past_min: np.ndarray | None = None  # the minimum of `_minima`
        self._in_window = 0
        self._clean = np.zeros(0)
        self._last_gain = np.ones(FRAME // 2 + 1)
        self._restart()

    def reset(self) -> None:
        """Drop what it holds, unprocessed (a cleared buffer); the next push starts a new
        stream, the noise estimate kept."""
        self._restart()

    def _restart(self) -> None:
        # The stream starts with half a frame of silence, so that its first samples lie in two
        # frames as all others do; the output of that silence is dropped (`_skip`).
        self._input = np.zeros(HOP, np.float32)
        self._tail = np.zeros(HOP, np.float32)  # the overlap the next frame completes
        self._skip = HOP
        self._pending = 0  # samples pushed since the stream started
        self._emitted = 0  # samples returned since then

    def push(self, chunk: np.ndarray) -> np.ndarray:
        """The next 16 kHz float32 mono input -> the output that is final now."""
        chunk = np.asarray(chunk, dtype=np.float32).reshape(-1)
        self._input = np.concatenate([self._input, chunk])
        self._pending += chunk.size
        return self._frames()

    def flush(self) -> np.ndarray:
        """The input has ended (a commit, a cleared buffer) -> the rest of the output; the next
        push starts a new stream (the noise estimate carries over)."""
        self._input = np.concatenate([self._input, np.zeros(FRAME, np.float32)])
        out = self._frames(learn=False)  # (the padding is no quiet room: the last gain holds)
        out = out[: self._pending - (self._emitted - out.size)]
        self._restart()
        return out

    def _frames(self, learn: bool = True) -> np.ndarray:
        count = (self._input.size - FRAME) // HOP + 1 if self._input.size >= FRAME else 0
        if count == 0:
            return np.zeros(0, np.float32)
        # Every frame the input holds at once (one FFT call each way); the gains in order.
        starts = np.arange(count) * HOP
        frames = self._input[starts[:, None] + np.arange(FRAME)] * self._window
        spectra = np.fft.rfft(frames, axis=1)
        gains = np.stack([self._gain(spectrum) if learn else self._last_gain for spectrum in spectra])
        cleaned = np.fft.irfft(spectra * gains, FRAME, axis=1).astype(np.float32) * self._window
        out = np.empty(count * HOP, np.float32)
        out[:HOP] = self._tail + cleaned[0, :HOP]
        out[HOP:] = (cleaned[:-1, HOP:] + cleaned[1:, :HOP]).reshape(-1)
        self._tail = cleaned[-1, HOP:].copy()
        self._input = self._input[count * HOP :]
        skipped = min(self._skip, out.size)
        done, self._skip = out[skipped:], self._skip - skipped
        self._emitted += done.size
        return done

    def _gain(self, spectrum: np.ndarray) -> np.ndarray:
        power = spectrum.real**2 + spectrum.imag**2
        if self._smoothed is None:  # the first frame: its power is the first guess of the noise
            self._smoothed, self._window_min, self._clean = power.copy(), power.copy(), np.zeros_like(power)
        self._smoothed = SMOOTHING * self._smoothed + (1.0 - SMOOTHING) * power
        self._window_min = np.minimum(self._window_min, self._smoothed)
        self._in_window += 1
        if self._in_window == SUB_WINDOW:
            self._minima = [*self._minima[1 - SUB_WINDOWS :], self._window_min]
            self._past_min = np.minimum.reduce(self._minima)
            self._window_min, self._in_window = self._smoothed.copy(), 0
        minimum = self._window_min if self._past_min is None else np.minimum(self._window_min, self._past_min)
        noise = MIN_BIAS * minimum + TINY
        posterior = power / noise
        prior = DECISION_DIRECTED * self._clean / noise + (1.0 - DECISION_DIRECTED) * np.maximum(posterior - 1.0, 0.0)
        gain = np.maximum(prior / (1.0 + prior), self._floor)
        self._clean, self._last_gain = gain**2 * power, gain
        return gain
