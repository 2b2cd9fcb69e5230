"""A conversation's title: the first words the assistant said in it.

An answer is stored as it plays, its text growing with it (heard_audio.py), and rewritten when
it ends (conversation_rows.update_turn), so the title is taken again whenever the text of an
assistant turn is written: it is always that of the conversation's first answer as stored now,
never the first fragment that happened to be there when it was inserted.
"""

from __future__ import annotations

from kimiaudio.store.sql import Sql

TITLE_CHARS = 60


def title_from(text: str, limit: int = TITLE_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rsplit(" ", 1)[0] + "…"


def retitle(db: Sql, conversation_id: str) -> None:
    """Title the conversation by its first answer with words (inside the caller's transaction)."""
    row = db.execute(
        "SELECT text FROM turns WHERE conversation_id = ? AND role = 'assistant' AND TRIM(text) != '' "
        "ORDER BY turn_index LIMIT 1",
        [conversation_id],
    ).fetchone()
    if row is not None:
        db.update("conversations", conversation_id, {"title": title_from(row[0])})
