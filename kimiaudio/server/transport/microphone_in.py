"""A call's microphone into its session (`read_microphone`): the incoming audio track's frames
(any rate and layout), resampled by PyAV to 16 kHz mono float, handed to
`RealtimeSession.push_audio` one by one, until the track ends or the client is gone.

The client is taken for gone when its audio never starts (FIRST_FRAME_TIMEOUT_S: ICE and DTLS
may take a while over the internet), or stops while the connection is no longer up
(INPUT_TIMEOUT_S). A microphone that stops on a live connection (muted: its track replaced by
none, or stopped) is heard as silence, so an utterance it cut ends and is answered; a client
that is really gone is noticed by the connection's own checks (ICE consent), which end the
call. A reader fallen behind drops audio rather than queue it without bound (input_clock.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.server.session.realtime_session import RealtimeSession
from kimiaudio.server.transport.input_clock import InputClock

INPUT_TIMEOUT_S = 4.0  # no audio frame for this long: muted (heard as silence), or gone if the connection is down
FIRST_FRAME_TIMEOUT_S = 20.0  # ICE + DTLS setup may take a while over the internet
FRAME_WAIT_S = 0.002  # recv() took longer: no frame was queued (a queued one returns at once)


async def read_microphone(
    track: MediaStreamTrack,
    session: RealtimeSession,
    clock: InputClock,
    connected: Callable[[], bool],
    closed: Callable[[], bool],
) -> str:
    """Feed `track` to `session` until it ends -> why, for the log. `connected`: whether the
    peer connection is up; `closed`: whether the call is closing."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=SPEECH_INPUT_RATE)
    timeout = FIRST_FRAME_TIMEOUT_S
    while not closed():  # (checked too: a cancel that a close sends may be swallowed)
        asked = time.monotonic()
        try:
            # asyncio.timeout, not wait_for: no task per frame, so a queued frame comes back
            # without a trip through the event loop and `waited` below is exact.
            async with asyncio.timeout(timeout):
                frame = await track.recv()
        except TimeoutError:
            if timeout == FIRST_FRAME_TIMEOUT_S or not connected():
                return f"no audio for {timeout:.0f} s: the client is gone"
            await session.push_audio(np.zeros(int(timeout * SPEECH_INPUT_RATE), np.float32))  # (muted)
            continue
        except MediaStreamError:
            break
        timeout = INPUT_TIMEOUT_S
        if not isinstance(frame, av.AudioFrame):
            continue  # an audio track hands out audio frames; anything else is not its audio
        if clock.is_behind(frame, waited=time.monotonic() - asked > FRAME_WAIT_S):
            continue  # overloaded: this audio is dropped rather than queued without bound
        for out in resampler.resample(frame):
            await session.push_audio(out.to_ndarray().reshape(-1))  # [n] float32 16 kHz
    return "the client hung up"
