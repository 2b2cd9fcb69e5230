"""The outgoing audio track of a session: assistant speech to the client over WebRTC.

`PlaybackTrack` is an aiortc MediaStreamTrack whose `recv()` hands out 20 ms frames of 48 kHz
mono s16, paced by their pts like aiortc's own AudioStreamTrack (frame n is due at
start + n * 20 ms). Pipeline PCM (24 kHz float32) is resampled to 48 kHz and goes through a
small jitter buffer: a response starts playing once `prebuffer_ms` is buffered (or the
response has ended), and after an underrun it waits for that much again instead of
stuttering. When idle it sends silence; `flush()` (barge-in) drops the buffer at once while
pts keeps advancing by one frame per frame, so the receiver sees no timestamp jump.

The track counts what it has actually sent for the current response, which is what an
interrupted turn is truncated to. It is the session's Playback (session/playback.py): the
listener given to `begin` hears when the response's first frame is sent and its last one was.

`MeteredPlaybackTrack` (what a WebRTC peer sends) also tells the server's metrics each
underrun: a response that had started playing runs out of buffered audio before its end and
the listener hears a gap (counted once per gap, not per silent frame). The answer audio itself
is counted by the session's Responder, as for any transport.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections import deque
from collections.abc import Callable

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE
from kimiaudio.audio.resampling import StreamResampler
from kimiaudio.server.session.playback import PlaybackListener

SAMPLE_RATE = 48000
FRAME_SAMPLES = 960  # 20 ms at 48 kHz
_TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
_MAX_LAG_S = 0.1  # further behind than this, re-anchor the clock instead of sending a burst
_FRAME_24K = FRAME_SAMPLES * SPEECH_OUTPUT_RATE // SAMPLE_RATE  # one 20 ms frame in 24 kHz samples


class PlaybackTrack(MediaStreamTrack):
    kind = "audio"
    # The pacing's clock and sleep (a test may swap in a fake pair: time then moves only by sleeping).
    clock = staticmethod(time.monotonic)
    sleep = staticmethod(asyncio.sleep)

    def __init__(self, prebuffer_ms: float = 60.0):
        super().__init__()
        self._prebuffer = int(prebuffer_ms * SAMPLE_RATE / 1000)
        self._listener: PlaybackListener | None = None  # the current response's
        self._chunks: deque[np.ndarray] = deque()  # int16 48 kHz pieces
        self._num_buffered = 0
        self._resampler: StreamResampler | None = None
        self.response_id: str | None = None
        self._input_ended = False  # no more audio will come for the current response
        self._playing = False  # prebuffer reached, frames are being drawn from the buffer
        self._num_played = 0  # 48 kHz samples of the current response sent so far
        self._start: float | None = None
        self._pts = 0
        self.is_consumed = False  # set by the first recv(): someone is sending this track

    # ----- producer side (the session) -----
    def begin(self, response_id: str, listener: PlaybackListener) -> None:
        """Start a new response (anything still buffered is dropped)."""
        self.flush()
        self.response_id = response_id
        self._listener = listener
        self._resampler = StreamResampler(SPEECH_OUTPUT_RATE, SAMPLE_RATE)

    def push(self, pcm24k: np.ndarray) -> None:
        if self._resampler is not None:
            self._append(self._resampler.push(pcm24k))

    def end(self) -> None:
        """The current response will send no more audio; play out what is buffered."""
        if self._resampler is not None:
            self._append(self._resampler.flush())
            self._resampler = None
        self._input_ended = True

    def flush(self) -> int:
        """Drop the current response at once; returns its samples played, in 24 kHz samples."""
        played = self.played_samples_24k
        self._chunks.clear()
        self._num_buffered = 0
        self._resampler = None
        self.response_id = None
        self._listener = None
        self._input_ended = False
        self._playing = False
        self._num_played = 0
        return played

    @property
    def played_samples_24k(self) -> int:
        return self._num_played * SPEECH_OUTPUT_RATE // SAMPLE_RATE

    @property
    def buffered_seconds(self) -> float:
        return self._num_buffered / SAMPLE_RATE

    def _append(self, pcm48k: np.ndarray) -> None:
        if pcm48k.size:
            self._chunks.append((np.clip(pcm48k, -1.0, 1.0) * 32767.0).astype(np.int16))
            self._num_buffered += pcm48k.size

    # ----- consumer side (aiortc's RTP sender) -----
    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        self.is_consumed = True
        await self._wait_for_next_frame()
        samples = self._next_samples()
        frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(samples.tobytes())
        frame.pts = self._pts
        frame.sample_rate = SAMPLE_RATE
        frame.time_base = _TIME_BASE
        return frame

    async def _wait_for_next_frame(self) -> None:
        # Pacing: frame n is due at start + n * 20 ms; pts always advances by one frame.
        if self._start is None:
            self._start = self.clock()
            self._pts = 0
            return
        self._pts += FRAME_SAMPLES
        wait = self._start + self._pts / SAMPLE_RATE - self.clock()
        if wait > 0:
            await self.sleep(wait)
        elif wait < -_MAX_LAG_S:
            # The loop was stalled: move the anchor rather than burst frames to catch up.
            self._start = self.clock() - self._pts / SAMPLE_RATE

    def _next_samples(self) -> np.ndarray:
        out = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        if self.response_id is None:
            return out
        if not self._playing:
            if self._input_ended and self._num_buffered == 0:
                self._finish()  # a response without (more) audio
                return out
            if self._num_buffered < self._prebuffer and not self._input_ended:
                return out
            self._playing = True
            if self._num_played == 0 and self._listener is not None:
                self._listener.playback_started(self.response_id)
        filled = 0
        while filled < FRAME_SAMPLES and self._chunks:
            chunk = self._chunks[0]
            n = min(FRAME_SAMPLES - filled, chunk.size)
            out[filled : filled + n] = chunk[:n]
            filled += n
            if n == chunk.size:
                self._chunks.popleft()
            else:
                self._chunks[0] = chunk[n:]
        self._num_buffered -= filled
        self._num_played += filled
        if self._num_buffered == 0:
            if self._input_ended:
                self._finish()
            else:
                self._playing = False  # underrun: wait for the prebuffer again
        return out

    def _finish(self) -> None:
        response_id, listener = self.response_id, self._listener
        self.response_id, self._listener, self._playing = None, None, False
        if listener is not None and response_id is not None:
            listener.playback_finished(response_id)


class MeteredPlaybackTrack(PlaybackTrack):
    """A PlaybackTrack that reports each underrun (`on_underrun`); only the track's public
    state is read."""

    def __init__(self, on_underrun: Callable[[], None]):
        super().__init__()
        self._on_underrun = on_underrun
        self._starved = False  # inside a gap of the current response

    async def recv(self) -> av.AudioFrame:
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
