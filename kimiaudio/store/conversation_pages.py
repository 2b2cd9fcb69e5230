"""The conversation list a page at a time, newest first.

Pages are cut by position, not by offset: a page ends at its last conversation's
(updated_at, id), and the next one holds those strictly older in that order, so a
conversation that gets a new turn meanwhile (and moves to the top) is neither repeated nor
makes another one skipped. The client gets the position as an opaque cursor (base64url of
JSON); one it altered is refused with PageCursorError.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from typing import Any

from kimiaudio.errors import KimiAudioError
from kimiaudio.store.identifiers import is_conversation_id

NEWEST_FIRST = "ORDER BY c.updated_at DESC, c.id DESC"  # (conversations as `c`)


class PageCursorError(KimiAudioError):
    """A cursor this server did not give."""


@dataclass(frozen=True)
class PageEnd:
    """Where a page ended: its last conversation's updated_at and id."""

    updated_at: float
    id: str

    def cursor(self) -> str:
        return base64.urlsafe_b64encode(json.dumps([self.updated_at, self.id]).encode()).decode().rstrip("=")


def page_end(conversation: dict[str, Any]) -> PageEnd:
    return PageEnd(conversation["updated_at"], conversation["id"])


def read_cursor(text: str) -> PageEnd:
    """The PageEnd a cursor of `cursor()` names; PageCursorError for anything else."""
    try:
        value = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, binascii.Error, RecursionError):  # (RecursionError: "[[[[..." nested past the stack)
        value = None
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], float)  # (as cursor() writes it: an int could be past any float)
        and math.isfinite(value[0])
        and is_conversation_id(value[1])
    ):
        return PageEnd(value[0], value[1])
    raise PageCursorError(f"cursor: {text[:60]!r} is not a cursor this server gave (next_cursor of a page)")


def older_than(end: PageEnd | None) -> tuple[str, list[Any]]:
    """The SQL condition on conversations `c` for the page after `end` (None: the first page),
    with its parameters."""
    if end is None:
        return "1 = 1", []
    return "(c.updated_at < ? OR (c.updated_at = ? AND c.id < ?))", [end.updated_at, end.updated_at, end.id]
