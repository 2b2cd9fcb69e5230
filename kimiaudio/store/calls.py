"""The live WebRTC calls of every instance sharing the database (table calls), so that a hang-up
may reach any of them.

A call is answered by one instance and lives there (its media and data channel go to it). Its
id is registered here with that instance's id; the instance renews its calls' rows every few
seconds (`sync_calls`) and deletes the rows of calls that ended. A hang-up that reaches another
instance (behind HAProxy, any may get it) marks the row (`request_hangup`), and the holder finds
the mark at its next sync and ends the call. A killed instance stops renewing: its rows expire,
and a hang-up of one of its calls is then answered like one of an unknown call. Times come from
the store's clock.
"""

from __future__ import annotations

from kimiaudio.store.conversation_store import ConversationStore
from kimiaudio.store.sql import Sql


async def register_call(store: ConversationStore, call_id: str, ttl_s: float) -> None:
    await store.write(_insert, call_id, store.instance_id, store.clock() + ttl_s)


async def sync_calls(store: ConversationStore, live: list[str], ended: list[str], ttl_s: float) -> list[str]:
    """Renew this instance's `live` calls, forget the `ended` ones -> the live ones asked to hang up."""
    return await store.write(_sync, store.instance_id, live, ended, store.clock() + ttl_s)


async def request_hangup(store: ConversationStore, call_id: str) -> bool:
    """Mark a live call of another instance for hang-up -> False if none has a call with this
    id (this instance's own calls are ended directly; a row of one not live here has ended)."""
    return await store.write(_mark, call_id, store.instance_id, store.clock())


def _insert(db: Sql, call_id: str, instance_id: str, expires_at: float) -> None:
    db.insert("calls", {"call_id": call_id, "instance_id": instance_id, "expires_at": expires_at, "hangup": 0})


def _sync(db: Sql, instance_id: str, live: list[str], ended: list[str], expires_at: float) -> list[str]:
    with db.atomic():
        for call_id in ended:
            db.execute("DELETE FROM calls WHERE call_id = ? AND instance_id = ?", [call_id, instance_id])
        db.execute("DELETE FROM calls WHERE expires_at < ?", [expires_at - 3600])  # rows of instances long gone
        for call_id in live:
            db.execute(
                "UPDATE calls SET expires_at = ? WHERE call_id = ? AND instance_id = ?",
                [expires_at, call_id, instance_id],
            )
        rows = db.execute("SELECT call_id FROM calls WHERE instance_id = ? AND hangup = 1", [instance_id]).fetchall()
    return [row[0] for row in rows]


def _mark(db: Sql, call_id: str, instance_id: str, now: float) -> bool:
    return (
        db.execute(
            "UPDATE calls SET hangup = 1 WHERE call_id = ? AND instance_id <> ? AND expires_at >= ?",
            [call_id, instance_id, now],
        ).rowcount
        > 0
    )
