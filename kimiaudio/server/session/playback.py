"""How a session's answers are played, whatever plays them: the Playback protocol.

A transport gives its session one Playback (transport/: PlaybackTrack and MeteredPlaybackTrack
for WebRTC, WsPlayback for the WebSocket). The session's Responder begins a response on it,
pushes the response's 24 kHz audio as it is generated, ends it, or flushes it at a barge-in;
the playback tells the response's listener (given to `begin`) when its first audio is played
and when its last audio has been, and says how much of it has been played: what an interrupted
answer is truncated to.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


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
