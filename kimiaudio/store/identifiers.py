"""What names a conversation or a turn, and what a client may send as one.

Conversation ids are unguessable (knowing one is what gives access to it); a client's id or
turn index that does not fit names nothing stored: the store's reads answer None and its
writes refuse it. (A turn index past SQLite's 64-bit INTEGER would otherwise escape as
OverflowError; no conversation has 2^31 turns.)
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from kimiaudio.errors import KimiAudioError

_CONVERSATION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TURN_INDEX = 2**31 - 1


def new_conversation_id() -> str:
    return secrets.token_urlsafe(16)


def is_conversation_id(value: Any) -> bool:
    return isinstance(value, str) and _CONVERSATION_ID.fullmatch(value) is not None


def is_turn_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TURN_INDEX


def check_turn(conversation_id: Any, index: Any) -> None:
    if not is_conversation_id(conversation_id):
        raise KimiAudioError(f"{conversation_id!r} is not a conversation id")
    if not is_turn_index(index):
        raise KimiAudioError(f"turn index must be an integer from 0 to {MAX_TURN_INDEX}, got {index!r}")
