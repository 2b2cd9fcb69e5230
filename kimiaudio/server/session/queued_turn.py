"""What a Realtime session queues for its turns to take in order (realtime_session.py), and
the ids of the conversation items it creates.

Six kinds of entry, each its own type, taken by structural match: a user utterance or an
audio item (QueuedAudio), a text item (QueuedText), a response.create (QueuedResponse), a
conversation.item.retrieve or .delete (QueuedEdit: queued so that it sees every item created
before it), a conversation.select (QueuedSelect), and the session's move off a conversation
another session took over (QueuedLeave). Each of the client's names the client event that
queued it (an `error` about it echoes that id), and an item where the client placed it. The
ids of items and responses are made here too.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

from kimiaudio.server.session.client_events import ItemDelete, ItemRetrieve, ItemTruncate, ResponseCreate
from kimiaudio.server.session.session_settings import SessionSettings


def new_item_id() -> str:
    return f"item_{secrets.token_hex(8)}"


def new_response_id() -> str:
    return f"resp_{secrets.token_hex(6)}"


@dataclass(frozen=True)
class ItemOrigin:
    """The client event an item came from: its `event_id`, and the item the client placed it
    after (conversation.item.create's previous_item_id; None: the end of the conversation)."""

    event_id: str | None = None
    previous_item_id: str | None = None


@dataclass(frozen=True)
class Utterance:
    """What the input audio buffer committed (the server's VAD, or the client's commit)."""

    barge_ins: int = 0  # the session's barge-in count when it was queued: a later one makes it moot
    respond: bool = False  # answered once stored (server VAD with create_response)
    interrupts: bool = False  # its speech interrupted the response in progress (barge-in)
    timed_out: bool = False  # the silence of an idle timeout (idle_timer.py): committed however quiet


@dataclass(frozen=True)
class QueuedAudio:
    """A user utterance (`utterance` set) or a conversation.item.create with audio: stored as
    a spoken user turn, then answered if the utterance asks."""

    item_id: str
    audio: np.ndarray  # 16 kHz
    text: str = ""  # an item's text parts
    utterance: Utterance | None = None
    origin: ItemOrigin = ItemOrigin()
    audio_first: bool = False  # the text came after the audio (False: before it)


@dataclass(frozen=True)
class QueuedText:
    """A conversation.item.create with text only: stored as a turn (a user's is answered when a
    response.create asks)."""

    item_id: str
    text: str
    role: str  # "user" | "assistant" | "system" (a system message: prompted as a user's text)
    origin: ItemOrigin = ItemOrigin()


@dataclass(frozen=True)
class QueuedResponse:
    """A response.create, with the session's settings as it found them (answered with those)."""

    request: ResponseCreate
    settings: SessionSettings
    cancels: int  # the session's count of response.cancel events that found no response yet
    barge_ins: int  # the session's barge-in count when it came: a later one cuts it as it starts
    event_id: str | None = None


@dataclass(frozen=True)
class QueuedEdit:
    """A conversation.item.retrieve or .delete; or a .truncate of an item that a queued retrieve
    or delete names, taken after them, in the order the client sent them (any other truncate is
    answered at once: item_edits.py)."""

    request: ItemRetrieve | ItemDelete | ItemTruncate
    event_id: str | None = None


@dataclass(frozen=True)
class QueuedSelect:
    """A conversation.select: queued so that every item created before it is stored in the
    conversation it leaves, and every one after it in the one it takes up."""

    conversation_id: str | None
    event_id: str | None = None


@dataclass(frozen=True)
class QueuedLeave:
    """Another session took over the conversation: the session leaves it for a new one (and
    every entry taken from then on, queued before this one too, goes to the new one)."""

    conversation_id: str


QueuedItem = QueuedAudio | QueuedText
QueuedTurn = QueuedAudio | QueuedText | QueuedResponse | QueuedEdit | QueuedSelect | QueuedLeave
