"""OpenAI's `idle_timeout_ms` (server VAD): once an answer has ended, a silence that lasts that
long commits its audio as the user's turn and starts a response, so the model takes the turn
back (a phone call where the caller says nothing).

The silence is measured on the input audio's own clock, as OpenAI's
`input_audio_buffer.timeout_triggered` reports it (`audio_start_ms`, `audio_end_ms`: offsets in
the audio written so far). It runs only while the session waits for its user: no response in
progress or queued, no speech being heard. The session names each such stretch (`stretch`: a
new name once anything happened, a response that ended, an item taken, even between two pieces
of audio), and a new name starts the silence again from zero, as does a cleared buffer or turn
detection switched (`restart`). While the VAD hears what may be speech but not yet for
min_speech_ms (it reports speech_started only then), the silence does not time out: it is
held, and either the speech starts (the stretch ends) or it was none and the silence goes on.
A session that has not answered yet has no timer: the timeout follows an answer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
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
        self._clock = 0  # samples written to the input audio buffer
        self._since: int | None = None  # where the silence began (None: not waiting)
        self._stretch: Hashable = None  # the name of the stretch it belongs to
        self._audio: deque[np.ndarray] = deque()
        self._kept = 0  # samples in _audio

    def heard(
        self, pcm: np.ndarray, stretch: Hashable, timeout_ms: int | None, max_samples: int, hold: bool = False
    ) -> IdleTimeout | None:
        """`pcm` (16 kHz) was written during `stretch` (None: the session does not wait for its
        user) -> the timeout, once the silence has lasted `timeout_ms` (None: no timeout). `hold`:
        what may be speech is being heard (not yet long enough to say): the silence goes on being
        measured, but does not time out until that is settled."""
        start = self._clock
        self._clock += pcm.size
        if stretch is None or timeout_ms is None:
            self.restart()
            return None
        if self._since is None or stretch != self._stretch:
            self.restart()
            self._since, self._stretch = start, stretch
        self._audio.append(pcm)
        self._kept += pcm.size
        while self._kept - self._audio[0].size >= max_samples:
            self._kept -= self._audio.popleft().size
        if hold or (self._clock - self._since) * 1000 < timeout_ms * SPEECH_INPUT_RATE:
            return None
        audio = np.concatenate(self._audio)[-max_samples:]
        timeout = IdleTimeout(_ms(self._since), _ms(self._clock), audio)
        self.restart()
        return timeout

    def restart(self) -> None:
        """No silence is being measured (the next that counts starts from zero)."""
        self._since = None
        self._audio.clear()
        self._kept = 0


def _ms(samples: int) -> int:
    return samples * 1000 // SPEECH_INPUT_RATE
