"""Leases: a conversation is held by at most one live session, across every instance that
shares the database (table leases: conversation, holding instance and session, expiry).

A session takes the lease when it opens or starts a conversation; while another session holds
an unexpired one, opening it is refused with ConversationBusyError (the server's 409
`conversation_busy`, with the seconds until it expires as Retry-After). The instance renews the
leases of its live sessions every third of `lease_seconds` (the heartbeat). A session's close
(or its move to another conversation) releases its own, joining the heard parts of an answer
whose final record it could not write, the database away then (heard_audio.py); one it could
not release, the database still away, is no longer renewed and expires. An instance killed
with -9 stops renewing: its leases expire, and the next session to open such a conversation
takes it over, joining in the same transaction the heard parts of the
answer that was playing (heard_audio.py), so the history it then loads is whole. Times come
from the store's clock (injectable in tests).

This module is the lease rows' queries and errors; which leases this instance holds, their
renewal and the writes made as a lease's holder are the lease book's (lease_book.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from kimiaudio.errors import KimiAudioError
from kimiaudio.store.heard_audio import join_conversation_parts
from kimiaudio.store.sql import Sql


class ConversationBusyError(KimiAudioError):
    """Another live session holds the conversation."""

    code = "conversation_busy"

    def __init__(self, conversation_id: str, retry_after_s: float):
        super().__init__(
            f"conversation {conversation_id!r} is open in another session; "
            f"try again in {math.ceil(retry_after_s)} s"  # as the 409's Retry-After rounds it
        )
        self.retry_after_s = retry_after_s


class ConversationNotFoundError(KimiAudioError):
    """The conversation is not (or no longer) stored: deleted, perhaps, while it was opened."""

    code = "conversation_not_found"

    def __init__(self, conversation_id: str):
        super().__init__(f"no conversation with id {conversation_id[:80]!r}")


class ConversationLostError(KimiAudioError):
    """The session's lease was taken over by another session (while this instance could not
    reach the database to renew it): nothing more of this session is stored in the conversation."""

    code = "conversation_lost"

    def __init__(self, conversation_id: str):
        super().__init__(
            f"conversation {conversation_id!r} was taken by another session while this server could not "
            "reach the database; nothing more is stored in it"
        )
        self.conversation_id = conversation_id


def acquire_row(
    db: Sql, conversation_id: str, instance_id: str, session_id: str, now: float, expires_at: float
) -> float | None:
    """Take (or renew) the lease; None if this session holds it now, else the seconds until
    the other holder's lease expires."""
    with db.atomic():
        if db.execute("SELECT 1 FROM conversations WHERE id = ?", [conversation_id]).fetchone() is None:
            raise ConversationNotFoundError(conversation_id)
        row = db.execute(
            "SELECT instance_id, session_id FROM leases WHERE conversation_id = ?", [conversation_id]
        ).fetchone()
        if row is not None and tuple(row) == (instance_id, session_id):
            db.execute("UPDATE leases SET expires_at = ? WHERE conversation_id = ?", [expires_at, conversation_id])
            return None
        # One statement decides between two instances racing for it: the insert, or the
        # take-over of an expired lease; neither changes a row when a live one holds it.
        taken = db.execute(
            "INSERT INTO leases (conversation_id, instance_id, session_id, expires_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (conversation_id) DO UPDATE SET instance_id = excluded.instance_id, "
            "session_id = excluded.session_id, expires_at = excluded.expires_at WHERE leases.expires_at < ?",
            [conversation_id, instance_id, session_id, expires_at, now],
        ).rowcount
        if not taken:
            held = db.execute("SELECT expires_at FROM leases WHERE conversation_id = ?", [conversation_id]).fetchone()
            return max(0.0, (held[0] if held else now) - now)
        join_conversation_parts(db, conversation_id)  # an answer its crashed holder was playing
        return None


def release_row(db: Sql, conversation_id: str, instance_id: str, session_id: str) -> None:
    """Let the conversation go, joining the heard parts its session left (an answer whose final
    record could not be written, the database away then, or whose turn failed): no later holder
    may come to join them. A lease taken over meanwhile is not the session's to release, nor
    are the parts of its new holder's answer its to join."""
    with db.atomic():
        released = db.execute(
            "DELETE FROM leases WHERE conversation_id = ? AND instance_id = ? AND session_id = ?",
            [conversation_id, instance_id, session_id],
        ).rowcount
        if released:
            join_conversation_parts(db, conversation_id)


def renew(db: Sql, instance_id: str, held: list[tuple[str, str]], expires_at: float) -> list[tuple[str, str]]:
    """Renew the leases `held` ((conversation, session) pairs) -> those no longer held: their row
    names another session now, or is gone (taken and released meanwhile). A row still naming
    the session was taken by nobody since, expired or not: renewing it is safe."""
    lost = []
    with db.atomic():
        for conversation_id, session_id in held:
            renewed = db.execute(
                "UPDATE leases SET expires_at = ? WHERE conversation_id = ? AND instance_id = ? AND session_id = ?",
                [expires_at, conversation_id, instance_id, session_id],
            ).rowcount
            if not renewed:
                lost.append((conversation_id, session_id))
    return lost


def as_holder(db: Sql, conversation_id: str, instance_id: str, session_id: str, fn: Callable, *args: Any) -> Any:
    """`fn(db, *args)`, a write into the conversation, in one transaction with the check that the
    session still holds its lease (ConversationLostError if not). The row stays locked
    (PostgreSQL) until the write commits, so a take-over comes wholly before or after it."""
    with db.atomic():
        row = db.execute(
            "SELECT 1 FROM leases WHERE conversation_id = ? AND instance_id = ? AND session_id = ?" + db.for_update,
            [conversation_id, instance_id, session_id],
        ).fetchone()
        if row is None:
            raise ConversationLostError(conversation_id)
        return fn(db, *args)


def release_instance(db: Sql, instance_id: str) -> None:
    db.execute("DELETE FROM leases WHERE instance_id = ?", [instance_id])


def drop_all_leases(db: Sql) -> None:
    db.execute("DELETE FROM leases")
