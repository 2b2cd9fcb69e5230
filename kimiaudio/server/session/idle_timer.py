"""OpenAI's `idle_timeout_ms` (server VAD): once an answer has ended, a silence that lasts that
long commits its audio as the user's turn and starts a response, so the model takes the turn
back (a phone call where the caller says nothing).

The silence is measured on the input audio's own clock, the audio the VAD hears, as OpenAI's
`input_audio_buffer.timeout_triggered` reports it (`audio_start_ms`, `audio_end_ms`: offsets in
the audio written so far). It runs only while the session waits for its user: no response in
progress or queued, no speech being heard; anything else starts it again from zero. A session
that has not answered yet has no timer: the timeout follows an answer.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from kimiaudio.audio.rates import SPEECH_INPUT_RATE


@dataclass(frozen=True)
class IdleTimeout:
    audio_start_ms: int
    audio_end_ms: int
    audio: np.ndarray  # the silence's audio, its last `max_samples` (16 kHz)


class IdleTimer:
    def __init__(self) -> None:
        self._clock = 0  # samples the VAD has heard
        self._since: int | None = None  # where the silence began (None: not waiting)
        self._audio: deque[np.ndarray] = deque()
        self._kept = 0  # samples in _audio

    def heard(self, pcm: np.ndarray, waiting: bool, timeout_ms: int | None, max_samples: int) -> IdleTimeout | None:
        """`pcm` (16 kHz) was heard while the session `waiting` for its user (or not) -> the
        timeout, once the silence has lasted `timeout_ms` (None: no timeout)."""
        start = self._clock
        self._clock += pcm.size
        if not waiting or timeout_ms is None:
            self._since = None
            self._audio.clear()
            self._kept = 0
            return None
        if self._since is None:
            self._since = start
        self._audio.append(pcm)
        self._kept += pcm.size
        while self._kept - self._audio[0].size >= max_samples:
            self._kept -= self._audio.popleft().size
        if (self._clock - self._since) * 1000 < timeout_ms * SPEECH_INPUT_RATE:
            return None
        audio = np.concatenate(self._audio)[-max_samples:]
        timeout = IdleTimeout(_ms(self._since), _ms(self._clock), audio)
        self._since = None
        self._audio.clear()
        self._kept = 0
        return timeout


def _ms(samples: int) -> int:
    return samples * 1000 // SPEECH_INPUT_RATE
