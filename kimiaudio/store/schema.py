"""SQLite schema of the conversation store and its migrations.

One database file under the data dir, opened in WAL mode with foreign keys on. The schema
version lives in `PRAGMA user_version`; `MIGRATIONS[i]` takes a database from version i to
i + 1 inside one transaction, so a crash mid-migration leaves the old version intact.

Tables:
- conversations(id, title, created_at, updated_at): id is unguessable (secrets.token_urlsafe).
- turns(id, conversation_id, turn_index, role, text, text_tokens, audio_tokens, timings,
  interrupted, created_at): token lists and timings are JSON text.
- turn_audio(turn_id, sample_rate, num_samples, wav): the turn's audio as a WAV blob
  (user 16 kHz, assistant 24 kHz), apart so that listing turns never reads audio.
- turn_audio_parts(turn_id, part_index, pcm): an assistant answer's audio as it is heard,
  appended (raw 16-bit 24 kHz) at least once a second while it plays; replaced by the
  turn_audio WAV when the answer ends, or, after a crash, when the store opens again.
- audio_answers(id, created_at, expires_at, text, audio_tokens, sample_rate, wav): spoken
  answers of POST /v1/chat/completions, kept until expires_at so that a later request can
  name one as an earlier assistant turn (`{"role": "assistant", "audio": {"id": ...}}`).
- voices(name, created_at, sample_rate, num_samples, pcm, codes): voice prompts added with
  POST /api/voices: the reference as float32 PCM (the exact input of its DiT prefix, so a
  prefix recomputed after a restart or an eviction is the same) and its semantic codes (JSON).
- turns.transcript (version 5): a spoken user turn's words, transcribed (NULL: not transcribed);
  turns_fts: the full-text index of every turn's text and transcript (search.py).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlite_utils

from kimiaudio.errors import KimiAudioError
from kimiaudio.store.search import FTS_SCHEMA

_V1 = """
CREATE TABLE conversations (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE turns (
    id INTEGER PRIMARY KEY,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    turn_index INTEGER NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    text TEXT NOT NULL DEFAULT '',
    text_tokens TEXT,
    audio_tokens TEXT,
    timings TEXT,
    interrupted INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    UNIQUE (conversation_id, turn_index)
);
CREATE TABLE turn_audio (
    turn_id INTEGER PRIMARY KEY REFERENCES turns(id) ON DELETE CASCADE,
    sample_rate INTEGER NOT NULL,
    num_samples INTEGER NOT NULL,
    wav BLOB NOT NULL
);
CREATE INDEX conversations_by_update ON conversations(updated_at);
"""

_V2 = """
CREATE TABLE audio_answers (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    text TEXT NOT NULL DEFAULT '',
    audio_tokens TEXT NOT NULL,
    sample_rate INTEGER NOT NULL,
    wav BLOB NOT NULL
);
CREATE INDEX audio_answers_by_expiry ON audio_answers(expires_at);
"""

_V3 = """
CREATE TABLE turn_audio_parts (
    turn_id INTEGER NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
    part_index INTEGER NOT NULL,
    pcm BLOB NOT NULL,
    PRIMARY KEY (turn_id, part_index)
);
"""

_V4 = """
CREATE TABLE voices (
    name TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    sample_rate INTEGER NOT NULL,
    num_samples INTEGER NOT NULL,
    pcm BLOB NOT NULL,
    codes TEXT NOT NULL
);
"""

_V5 = """
ALTER TABLE turns ADD COLUMN transcript TEXT;
""" + FTS_SCHEMA

# MIGRATIONS[i] migrates from user_version i to i + 1.
MIGRATIONS: list[str] = [_V1, _V2, _V3, _V4, _V5]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema to SCHEMA_VERSION; returns the version found before."""
    found = conn.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        raise KimiAudioError(
            f"database schema version {found} is newer than this kimiaudio knows ({SCHEMA_VERSION}); "
            "upgrade kimiaudio or point storage.data_dir at another directory"
        )
    for version in range(found, SCHEMA_VERSION):
        # executescript would commit on its own; run the statements in one explicit
        # transaction so a migration is all or nothing.
        conn.execute("BEGIN")
        try:
            for statement in _statements(MIGRATIONS[version]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return found


def _statements(script: str):
    """The statements of a migration, one by one (a trigger's body holds ";" of its own)."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            yield statement
            statement = ""
    if statement.strip():
        yield statement


def open_database(path: str | Path) -> sqlite_utils.Database:
    """Open (creating if needed) and migrate the store database at `path`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are explicit (sqlite-utils `db.atomic()`).
        conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise KimiAudioError(f"{path}: cannot open the conversation database ({exc})") from None
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        # NORMAL is durable against a killed process in WAL mode (only a power cut can
        # lose the last transactions), and much cheaper than FULL.
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        migrate(conn)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise KimiAudioError(f"{path}: not a usable conversation database ({exc})") from None
    except BaseException:
        conn.close()
        raise
    return sqlite_utils.Database(conn)


def integrity_problems(db: sqlite_utils.Database) -> list[str]:
    """What `PRAGMA integrity_check` and `PRAGMA foreign_key_check` find (empty: all is well)."""
    problems = [row[0] for row in db.execute("PRAGMA integrity_check").fetchall() if row[0] != "ok"]
    problems += [f"foreign key: {tuple(row)}" for row in db.execute("PRAGMA foreign_key_check").fetchall()]
    return problems
