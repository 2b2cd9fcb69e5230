"""What a Realtime session queues for its turns to take in order (realtime_session.py), and
the ids of the conversation items it creates."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

from kimiaudio.server.session.client_events import ResponseCreate


def new_item_id() -> str:
    return f"item_{secrets.token_hex(8)}"


@dataclass
class QueuedTurn:
    """One entry of a session's turn queue: what the client committed or asked for, taken in order."""

    kind: str  # "audio" (a user utterance) | "text" (a text item) | "respond" (response.create)
    item_id: str
    audio: np.ndarray | None = None  # 16 kHz
    text: str = ""
    role: str = "user"
    barge_ins: int = 0  # the session's barge-in count when it was queued
    respond: bool = False
    request: ResponseCreate | None = None
    cancels: int = 0  # the session's count of response.cancel events that found no response yet
