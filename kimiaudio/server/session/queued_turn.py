"""What a Realtime session queues for its turns to take in order (realtime_session.py), and
the ids of the conversation items it creates.

Three kinds of entry, each its own type, taken by structural match: a user utterance or an
audio item (QueuedAudio), a text item (QueuedText), a response.create (QueuedResponse).
The ids of items and responses are made here too.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

from kimiaudio.server.session.client_events import ResponseCreate


def new_item_id() -> str:
    return f"item_{secrets.token_hex(8)}"


def new_response_id() -> str:
    return f"resp_{secrets.token_hex(6)}"


@dataclass(frozen=True)
class QueuedAudio:
    """A user utterance (committed by the VAD or the client), or a conversation.item.create
    with audio: stored as a spoken user turn, then answered if `respond`."""

    item_id: str
    audio: np.ndarray  # 16 kHz
    text: str = ""  # an item's text parts, before its audio
    barge_ins: int = 0  # the session's barge-in count when it was queued: a later one makes it moot
    respond: bool = False


@dataclass(frozen=True)
class QueuedText:
    """A conversation.item.create with text only: stored as a turn (a user's is answered when a
    response.create asks)."""

    item_id: str
    text: str
    role: str  # "user" | "assistant" (a system message is context like a user's text)


@dataclass(frozen=True)
class QueuedResponse:
    """A response.create."""

    request: ResponseCreate
    cancels: int  # the session's count of response.cancel events that found no response yet


QueuedItem = QueuedAudio | QueuedText
QueuedTurn = QueuedAudio | QueuedText | QueuedResponse
