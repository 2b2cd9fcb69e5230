"""How far a session's microphone reader is behind the audio it is given, and what it drops.

The reader hands every 20 ms frame to the VAD (one thread for all sessions) and waits for it.
When the server cannot keep up, frames pile up in aiortc's track queue, which has no bound:
memory grows by the second and speech is heard later and later. Comparing the frames' media time with the wall
clock says how far behind the reader is; past MAX_LAG_S it drops frames (without the VAD)
until it has caught up, so a session under overload loses some audio instead of the server
its memory. Dropped audio is counted (kimiaudio_input_audio_dropped_seconds_total) and logged
at most once per WARN_EVERY_S per session.

Lag is only a backlog if frames are waiting: a reader that had to wait for its frame is caught
up, however late the frame's media time is. Such a frame re-anchors the clock, so a sender
that fell behind its own clock (a stalled client, a longer network path) is never mistaken
for an overloaded server, whose audio would otherwise be dropped for good.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

MAX_LAG_S = 1.0  # behind real time by more than this: drop until caught up
WARN_EVERY_S = 30.0  # one warning per session in this long, however often it falls behind


class InputClock:
    def __init__(self, session_id: str, on_dropped: Callable[[float], None]):
        self._session_id = session_id
        self._on_dropped = on_dropped
        self._anchor: tuple[float, float] | None = None  # (wall clock, media time) of the first frame
        self._dropping = False
        self._warned_at: float | None = None

    def is_behind(self, frame, waited: bool, now: float | None = None) -> bool:
        """True if `frame` (an av.AudioFrame with a time) should be dropped. `waited`: the
        reader had to wait for this frame (none was queued)."""
        now = time.monotonic() if now is None else now
        media = frame.time
        if media is None:
            return False
        # The first frame, a sender that restarted its clock, or a reader with nothing queued.
        if self._anchor is None or media < self._anchor[1] or waited:
            self._anchor = (now, media)
        # A sender that paused (no packets) and resumes is not behind: keep the lag from going negative.
        lag = (now - self._anchor[0]) - (media - self._anchor[1])
        if lag < 0:
            self._anchor, lag = (now, media), 0.0
        behind = lag > MAX_LAG_S if not self._dropping else lag > MAX_LAG_S / 4
        if behind:
            if not self._dropping and (self._warned_at is None or now - self._warned_at > WARN_EVERY_S):
                self._warned_at = now
                log.warning(
                    "session %s: the server is %.1f s behind this microphone; dropping its audio until it catches up",
                    self._session_id,
                    lag,
                )
            self._on_dropped(frame.samples / frame.sample_rate)
        self._dropping = behind
        return behind
