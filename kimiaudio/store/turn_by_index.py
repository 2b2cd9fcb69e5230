"""One stored turn by its index: read whole (its audio decoded), or deleted.

A turn's index names it for good: a deleted turn leaves a gap, the turns after it keep their
indexes, and no later turn gets its index (conversations.next_turn_index, conversation_rows.py
`add_turn`). So whatever still holds an index (an answer being stored as it plays, a
transcript on its way) writes into its own turn or, the turn gone, into none
(update_turn's "no turn" error), never into another. Deleting a turn removes its audio and its
words from the search index with it, and the conversation's title is taken again (a deleted
answer's words do not stay as its title). Queries run on the ConversationStore's threads.
"""

from __future__ import annotations

import time

from kimiaudio.store.conversation_rows import StoredTurn, stored_turn
from kimiaudio.store.conversation_store import ConversationStore
from kimiaudio.store.identifiers import is_conversation_id, is_turn_index
from kimiaudio.store.sql import Sql
from kimiaudio.store.titles import retitle


async def get_turn(store: ConversationStore, conversation_id: str, index: int) -> StoredTurn | None:
    """The turn at `index` with its audio and transcript, or None if there is none."""
    if not (is_conversation_id(conversation_id) and is_turn_index(index)):
        return None
    return await store.read(_select, conversation_id, index)


async def delete_turn(store: ConversationStore, conversation_id: str, index: int, holder: str | None = None) -> bool:
    """Delete the turn at `index` (and its audio); False if there was none. `holder`: the
    session that must hold the conversation's lease (LeaseBook.write_turns, lease_book.py)."""
    if not (is_conversation_id(conversation_id) and is_turn_index(index)):
        return False
    return await store.leases.write_turns(conversation_id, holder, _delete, index)


def _select(db: Sql, conversation_id: str, index: int) -> StoredTurn | None:
    rows = db.query(
        "SELECT t.*, a.wav, a.sample_rate FROM turns t LEFT JOIN turn_audio a ON a.turn_id = t.id "
        "WHERE t.conversation_id = ? AND t.turn_index = ?",
        [conversation_id, index],
    )
    return stored_turn(rows[0]) if rows else None


def _delete(db: Sql, conversation_id: str, index: int) -> bool:
    with db.atomic():
        # ON DELETE CASCADE removes its audio and heard parts; a trigger (SQLite) or the
        # generated column (PostgreSQL) takes its words out of the search index.
        cursor = db.execute("DELETE FROM turns WHERE conversation_id = ? AND turn_index = ?", [conversation_id, index])
        if cursor.rowcount == 0:
            return False
        db.update("conversations", conversation_id, {"updated_at": time.time(), "title": ""})
        retitle(db, conversation_id)
    return True
