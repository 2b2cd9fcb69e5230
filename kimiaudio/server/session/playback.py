"""How a session's answers are played, whatever plays them: the Playback protocol.

A transport gives its session one Playback (transport/: PlaybackTrack and MeteredPlaybackTrack
for WebRTC, WsPlayback for the WebSocket). The session's Responder begins a response on it,
pushes the response's 24 kHz audio as it is generated, ends it, or flushes it at a barge-in;
the playback tells the response's listener (given to `begin`) when its first audio is played
and when its last audio has been, and says how much of it has been played: what an interrupted
answer is truncated to.

`CountedPlayback` wraps a transport's Playback so that the audio pushed to it is counted
(`on_audio`, seconds: the server's kimiaudio_audio_generated_seconds): every session's answer
audio passes `push`, whatever carries it, so both transports count it here and alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE


class PlaybackListener(Protocol):
    def playback_started(self, response_id: str) -> None:
        """The response's first audio is being played."""

    def playback_finished(self, response_id: str) -> None:
        """The response's last audio has been played (after `end`; never after `flush`)."""


class Playback(Protocol):
    @property
    def response_id(self) -> str | None: ...  # the response playing, None when idle

    @property
    def is_consumed(self) -> bool: ...  # someone receives what it plays (a track nobody sends is not)

    @property
    def played_samples_24k(self) -> int: ...  # of the current response, in 24 kHz samples

    def begin(self, response_id: str, listener: PlaybackListener) -> None:
        """Start a new response (anything still buffered is dropped)."""

    def push(self, pcm24k: np.ndarray) -> None:
        """The next 24 kHz float32 mono audio of the current response."""

    def end(self) -> None:
        """The current response will send no more audio; play out what is buffered."""

    def flush(self) -> int:
        """Drop the current response at once -> its samples played (24 kHz)."""


class CountedPlayback:
    """`playback`, with each push's seconds told to `on_audio`. What was pushed before a barge-in
    counts, heard or not: it was generated for the answer (the Responder pushes nothing of an
    answer once it is cut, so audio the detokenizer finishes after the cut is not counted)."""

    def __init__(self, playback: Playback, on_audio: Callable[[float], None]):
        self._playback = playback
        self._on_audio = on_audio

    @property
    def response_id(self) -> str | None:
        return self._playback.response_id

    @property
    def is_consumed(self) -> bool:
        return self._playback.is_consumed

    @property
    def played_samples_24k(self) -> int:
        return self._playback.played_samples_24k

    def begin(self, response_id: str, listener: PlaybackListener) -> None:
        self._playback.begin(response_id, listener)

    def push(self, pcm24k: np.ndarray) -> None:
        if self._playback.response_id is not None:  # audio of no response is dropped, not played
            self._on_audio(pcm24k.size / SPEECH_OUTPUT_RATE)
        self._playback.push(pcm24k)

    def end(self) -> None:
        self._playback.end()

    def flush(self) -> int:
        return self._playback.flush()
