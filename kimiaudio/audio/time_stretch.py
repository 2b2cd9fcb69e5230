"""TimeStretch: a spoken answer played faster or slower at its own pitch, as it streams
(OpenAI's Realtime `audio.output.speed`, a post-processing of the audio generated).

WSOLA (waveform-similarity overlap-add): the output is built of frames FRAME_MS long, each
half a frame after the one before; frame k is read from the input near k x hop x speed, moved
by up to SEARCH_MS to where the input looks most like the natural continuation of frame k-1
(the samples that followed it in the input; the correlation normalised by each candidate's
energy, so the likeness decides and not the loudness), so that the overlap adds waveforms in
phase and the pitch periods stay whole. Hann windows at half-frame hops add up to one, so a stretch of
1.0 would give the input back; `push` passes the input through untouched at 1.0 anyway.

Streaming: `push` takes the next chunk and returns the output that no later input can
change; `flush` (the answer's end) returns the rest. The output is the same however the input
is cut into chunks. Before a frame can be placed, the input must reach past its search range,
so the output lags the input by about a frame plus the search (at most MAX_INPUT_LAG_S). The
first half frame is the input's own start, and the input's end is followed by silence, so the
answer neither fades in nor loses its last samples; the output is `round(input / speed)`
samples long.
"""

from __future__ import annotations

import numpy as np

FRAME_MS = 30.0  # a few pitch periods of the lowest voices
SEARCH_MS = 12.5  # one period of an 80 Hz voice
MIN_SPEED, MAX_SPEED = 0.25, 1.5  # OpenAI's range
MAX_INPUT_LAG_S = 0.060  # the most input the output lags behind (a frame, the search, a hop)


class TimeStretch:
    def __init__(self, speed: float, sample_rate: int):
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed {speed} is outside [{MIN_SPEED}, {MAX_SPEED}]")
        self.speed = float(speed)
        self._frame = 2 * round(sample_rate * FRAME_MS / 2000)  # even: two hops
        self._hop = self._frame // 2
        self._search = round(sample_rate * SEARCH_MS / 1000)
        self._window = np.hanning(self._frame + 1)[:-1].astype(np.float32)  # periodic: hops sum to 1
        self._fft_size = 1 << int(np.ceil(np.log2(2 * self._frame + 2 * self._search)))
        self._input = np.zeros(0, np.float32)
        self._input_start = 0  # input index of self._input[0]
        self._input_total = 0  # samples pushed
        self._frames = 0  # frames placed
        self._previous: int | None = None  # input index of the last frame placed
        self._tail = np.zeros(self._frame, np.float32)  # output from `_emitted` on, frames overlapping
        self._emitted = 0  # output samples returned

    @property
    def passthrough(self) -> bool:
        return self.speed == 1.0

    def push(self, chunk: np.ndarray) -> np.ndarray:
        """The next input -> the output that is final now (float32 mono)."""
        chunk = np.asarray(chunk, dtype=np.float32).reshape(-1)
        if self.passthrough:
            return chunk
        self._input = np.concatenate([self._input, chunk])
        self._input_total += chunk.size
        return self._place()

    def flush(self) -> np.ndarray:
        """The input has ended -> the rest of the output."""
        if self.passthrough:
            return np.zeros(0, np.float32)
        target = round(self._input_total / self.speed)
        # Silence after the end, as far as the frames that fill the output up to `target` read.
        pad = self._frame + 2 * self._search + self._hop
        self._input = np.concatenate([self._input, np.zeros(pad, np.float32)])
        out = self._place(until=target)
        over = self._emitted - target  # the last frame's hop may run past the end
        return out[: out.size - over] if over > 0 else out

    def _nominal(self, k: int) -> int:
        return round(k * self._hop * self.speed)

    def _place(self, until: int | None = None) -> np.ndarray:
        """Place every frame whose input is all there (at the end: those that start before
        the output's length `until`) -> the output completed."""
        out = []
        while True:
            k = self._frames
            if until is not None and k * self._hop >= until:
                break
            nominal = self._nominal(k)
            low = max(0, nominal - self._search) if k else 0
            high = nominal + self._search if k else 0
            needed = high + self._frame
            if self._previous is not None:
                needed = max(needed, self._previous + self._hop + self._frame)
            if needed > self._input_start + self._input.size:
                break
            start = self._best_start(self._previous, low, high) if self._previous is not None else 0
            frame = self._segment(start, self._frame)
            if k == 0:  # the input's own start: no frame before it to fade in from
                self._tail[: self._hop] += frame[: self._hop] * (1.0 - self._window[: self._hop])
            self._tail += frame * self._window
            out.append(self._tail[: self._hop].copy())  # no later frame reaches these
            self._tail = np.concatenate([self._tail[self._hop :], np.zeros(self._hop, np.float32)])
            self._emitted += self._hop
            self._previous, self._frames = start, k + 1
            self._drop_read_input()
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def _best_start(self, previous: int, low: int, high: int) -> int:
        """The input index in [low, high] whose frame best continues the frame read at `previous`."""
        template = self._segment(previous + self._hop, self._frame)
        region = self._segment(low, high - low + self._frame)
        n = self._fft_size
        spectrum = np.fft.rfft(region, n) * np.conj(np.fft.rfft(template, n))
        correlation = np.fft.irfft(spectrum, n)[: high - low + 1]
        # Normalised by each candidate's energy: a raw correlation favours the loudest
        # candidate, which would make the stretched answer louder than the original.
        energy = np.concatenate([[0.0], np.cumsum(region.astype(np.float64) ** 2)])
        candidate = energy[self._frame : self._frame + high - low + 1] - energy[: high - low + 1]
        return low + int(np.argmax(correlation / np.sqrt(candidate + 1e-9)))

    def _segment(self, start: int, length: int) -> np.ndarray:
        offset = start - self._input_start
        return self._input[offset : offset + length]

    def _drop_read_input(self) -> None:
        """Forget input no later frame can read (the next frame's search, or continuation)."""
        keep_from = min(self._nominal(self._frames) - self._search, (self._previous or 0) + self._hop)
        drop = max(0, keep_from - self._input_start)
        if drop:
            self._input = self._input[drop:]
            self._input_start += drop
