"""A session's playback over a WebSocket: the Playback protocol without a media track.

Each chunk of a response's 24 kHz audio goes out at once as one `response.output_audio.delta`
(base64 pcm16 24 kHz mono, OpenAI's format); the client buffers and plays it. The server
cannot hear the client's speaker, so what has been played is estimated by a real-time clock
started at the first delta: played = min(sent, elapsed * 24 kHz). That estimate is what a
barge-in truncates the stored answer to; a client's conversation.item.truncate (what it
really played) overrides it. Playback counts as finished when the clock passes the end of
the audio sent, so a response stays "playing" (and interruptible) as long as on WebRTC.
It is the session's Playback (session/playback.py), as PlaybackTrack is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np

from kimiaudio.audio import pcm16
from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE
from kimiaudio.server.session.playback import PlaybackListener


class WsPlayback:
    def __init__(self, send_audio: Callable[[str, bytes], None], clock: Callable[[], float] = time.monotonic):
        self._send_audio = send_audio  # (response id, pcm16 bytes) -> sends one audio delta
        self._clock = clock
        self._listener: PlaybackListener | None = None  # the current response's
        self.is_consumed = True  # a WebSocket client receives what is sent
        self.response_id: str | None = None
        self._started_at: float | None = None  # clock at the first delta of the response
        self._num_sent = 0  # 24 kHz samples sent for the current response
        self._finish: asyncio.TimerHandle | None = None

    def begin(self, response_id: str, listener: PlaybackListener) -> None:
        """Start a new response (anything of the previous one is forgotten)."""
        self.flush()
        self.response_id = response_id
        self._listener = listener

    def push(self, pcm24k: np.ndarray) -> None:
        if self.response_id is None or pcm24k.size == 0:
            return
        self._send_audio(self.response_id, pcm16.to_bytes(pcm24k))
        self._num_sent += pcm24k.size
        if self._started_at is None:
            self._started_at = self._clock()
            if self._listener is not None:
                self._listener.playback_started(self.response_id)

    def end(self) -> None:
        """No more audio for this response: it finishes when the clock reaches its end."""
        if self.response_id is None:
            return
        elapsed = self._clock() - self._started_at if self._started_at is not None else 0.0
        left = self._num_sent / SPEECH_OUTPUT_RATE - elapsed
        self._finish = asyncio.get_running_loop().call_later(max(left, 0.0), self._finished, self.response_id)

    def flush(self) -> int:
        """Stop the current response now; returns its samples played (24 kHz), as estimated."""
        played = self.played_samples_24k
        if self._finish is not None:
            self._finish.cancel()
        self.response_id, self._started_at, self._num_sent, self._finish = None, None, 0, None
        self._listener = None
        return played

    @property
    def played_samples_24k(self) -> int:
        if self._started_at is None:
            return 0
        return min(self._num_sent, int((self._clock() - self._started_at) * SPEECH_OUTPUT_RATE))

    def _finished(self, response_id: str) -> None:
        if self.response_id != response_id:
            return
        listener, self._listener = self._listener, None
        self.response_id, self._finish = None, None
        if listener is not None:
            listener.playback_finished(response_id)
