"""A playback's listener for the tests: what a Playback told about the responses it played."""

from __future__ import annotations


class ListenerLog:
    """A PlaybackListener (kimiaudio/server/session/playback.py) that keeps each call, in order,
    as ("start" | "end", response id)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def playback_started(self, response_id: str) -> None:
        self.calls.append(("start", response_id))

    def playback_finished(self, response_id: str) -> None:
        self.calls.append(("end", response_id))
