"""The WebRTC playback track, metered: audio seconds made and underruns heard.

A PlaybackTrack that also tells the server's metrics (a) the seconds of answer audio pushed
to it and (b) each underrun: a response that had started playing runs out of buffered audio
before its end and the listener hears a gap (counted once per gap, not per silent frame).
Only the track's public state is read: its current response and samples played.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE
from kimiaudio.server.transport.audio_track import FRAME_SAMPLES, SAMPLE_RATE, PlaybackTrack

_FRAME_24K = FRAME_SAMPLES * SPEECH_OUTPUT_RATE // SAMPLE_RATE  # one 20 ms frame in 24 kHz samples


class MeteredPlaybackTrack(PlaybackTrack):
    def __init__(self, on_audio: Callable[[float], None], on_underrun: Callable[[], None]):
        super().__init__()
        self._on_audio, self._on_underrun = on_audio, on_underrun
        self._starved = False  # inside a gap of the current response

    def push(self, pcm24k: np.ndarray) -> None:
        if self.response_id is not None:
            self._on_audio(np.size(pcm24k) / SPEECH_OUTPUT_RATE)
        super().push(pcm24k)

    async def recv(self):
        response_id, played = self.response_id, self.played_samples_24k
        frame = await super().recv()
        if response_id is not None and self.response_id == response_id and played > 0:
            short = self.played_samples_24k - played < _FRAME_24K  # the buffer ran dry in this frame
            if short and not self._starved:
                self._on_underrun()
            self._starved = short
        else:
            self._starved = False
        return frame
