"""Finding conversations by what was said in them: SQLite FTS5 over the turns' words.

`turns_fts` indexes each turn's `text` (the assistant's words, a user's typed text) and
`transcript` (the user's spoken words, transcribed) as an external-content FTS5 table over
`turns`: triggers keep it in step with every insert, update and delete (a conversation's
cascade delete included), and the migration that creates it indexes the rows already there.

A client's `q` is never passed to FTS5 as syntax: each whitespace-separated word becomes a
quoted prefix phrase ("word"*), all of them required, so quotes, parentheses, AND/OR/NEAR
or a lone `*` are matched as text, never parsed. `match_expression` is that translation and
is the only part another backend must redo in its own dialect (PostgreSQL: a tsvector over
text || transcript with a GIN index, or pg_trgm for substrings); `search_conversations`
runs it on SQLite.
"""

from __future__ import annotations

from typing import Any

import sqlite_utils

from kimiaudio.errors import KimiAudioError

MAX_QUERY_CHARS = 200
MAX_QUERY_WORDS = 16

# Appended to the schema's migrations (schema.py), after the `transcript` column exists.
# Statements end with ";" at a line's end; a trigger's body is one statement.
FTS_SCHEMA = """
CREATE VIRTUAL TABLE turns_fts USING fts5(
    text, transcript, content='turns', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
);
CREATE TRIGGER turns_fts_insert AFTER INSERT ON turns BEGIN
    INSERT INTO turns_fts(rowid, text, transcript) VALUES (new.id, new.text, new.transcript);
END;
CREATE TRIGGER turns_fts_delete AFTER DELETE ON turns BEGIN
    INSERT INTO turns_fts(turns_fts, rowid, text, transcript) VALUES ('delete', old.id, old.text, old.transcript);
END;
CREATE TRIGGER turns_fts_update AFTER UPDATE OF text, transcript ON turns BEGIN
    INSERT INTO turns_fts(turns_fts, rowid, text, transcript) VALUES ('delete', old.id, old.text, old.transcript);
    INSERT INTO turns_fts(rowid, text, transcript) VALUES (new.id, new.text, new.transcript);
END;
INSERT INTO turns_fts(turns_fts) VALUES ('rebuild');
"""


class SearchQueryError(KimiAudioError):
    """A search query that cannot be used (too long, too many words)."""


def query_words(q: str) -> list[str]:
    """The words of a client's query, checked; empty for a blank query."""
    if len(q) > MAX_QUERY_CHARS:
        raise SearchQueryError(f"q: at most {MAX_QUERY_CHARS} characters, got {len(q)}")
    words = q.split()
    if len(words) > MAX_QUERY_WORDS:
        raise SearchQueryError(f"q: at most {MAX_QUERY_WORDS} words, got {len(words)}")
    return words


def match_expression(words: list[str]) -> str:
    """FTS5 MATCH text requiring every word as a prefix, each quoted (never parsed as syntax)."""
    return " ".join('"' + word.replace('"', '""') + '"*' for word in words)


def search_conversations(db: sqlite_utils.Database, words: list[str], limit: int) -> list[dict[str, Any]]:
    """The conversations (newest first) with a turn holding every word, in list_conversations' shape."""
    rows = db.execute(
        "SELECT c.id, c.title, c.created_at, c.updated_at, "
        "(SELECT COUNT(*) FROM turns n WHERE n.conversation_id = c.id) AS num_turns "
        "FROM conversations c WHERE c.id IN ("
        "  SELECT t.conversation_id FROM turns_fts JOIN turns t ON t.id = turns_fts.rowid WHERE turns_fts MATCH ?"
        ") ORDER BY c.updated_at DESC LIMIT ?",
        [match_expression(words), limit],
    ).fetchall()
    keys = ("id", "title", "created_at", "updated_at", "num_turns")
    return [dict(zip(keys, row)) for row in rows]
