"""Schema of the conversation store and its migrations, for both backends (sql.py).

SQLite: one database file under the data dir, opened in WAL mode with foreign keys on; the
schema version lives in `PRAGMA user_version`. PostgreSQL: the same tables (types translated
by `Sql.ddl`), the version in the one-row table kimiaudio_schema. `MIGRATIONS[i]` takes a
database from version i to i + 1 inside one transaction, so a crash mid-migration leaves the
old version intact; on PostgreSQL an advisory lock makes one of several instances starting at
once migrate while the others wait. A migration is SQL in SQLite's spelling that both run, or
a {backend kind: SQL} dict where they differ (e.g. SQLite's FTS5 beside PostgreSQL's tsvector).

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
- leases(conversation_id, instance_id, session_id, expires_at): which live session holds a
  conversation, fleet-wide (leases.py).
- turns.transcript (version 6): a spoken user turn's words, transcribed (NULL: not transcribed),
  and the full-text index of every turn's text and transcript (search.py: SQLite's FTS5 table
  turns_fts, PostgreSQL's tsvector column turns.search_doc).
- access_keys(key_hash, scope, created_at, expires_at, session) (version 7): short-lived keys
  the server handed out (ephemeral Realtime keys, the page's sign-ins), by the SHA-256 of
  the key (access_keys.py); shared, so a key minted by one instance opens sessions on all.
- calls(call_id, instance_id, expires_at, hangup) (version 7): the live WebRTC calls of every
  instance, so that a hang-up reaching another instance is passed on to it (calls.py).
- conversations.next_turn_index (version 8): the index its next turn gets, above every index
  it ever had, so that a deleted turn's index is never given again (turn_by_index.py); and
  turns.audio_first: a user turn whose text came after its audio (0: before it, or none).
- turns.search_doc (version 9, PostgreSQL only): rebuilt over the letters and digits of the
  text and transcript (search.py).
- calls (version 10): made where version 7 did not make it.
- turns.from_system (version 11): a system message (a Realtime system item), stored as a user
  turn of text (the model has no system role) and read back as role "system" (conversation_rows.py).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlite_utils

from kimiaudio.errors import KimiAudioError
from kimiaudio.store.location import DATABASE_URL_ENV
from kimiaudio.store.search import SEARCH_SCHEMA, SEARCH_WORDS_ONLY
from kimiaudio.store.sql import Sql, SqliteSql

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
CREATE TABLE leases (
    conversation_id TEXT PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
    instance_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX leases_by_instance ON leases(instance_id);
"""

_V6 = {kind: "ALTER TABLE turns ADD COLUMN transcript TEXT;\n" + schema for kind, schema in SEARCH_SCHEMA.items()}

_ACCESS_KEYS = """
CREATE TABLE access_keys (
    key_hash TEXT PRIMARY KEY,
    scope TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    session TEXT
);
CREATE INDEX access_keys_by_expiry ON access_keys(expires_at);
"""
# Also migration 10: some databases of version 7 have only its access_keys (as kimiaudio 0178c26
# migrated them), and every call opened on them failed.
_CALLS = """
CREATE TABLE IF NOT EXISTS calls (
    call_id TEXT PRIMARY KEY,
    instance_id TEXT NOT NULL,
    expires_at REAL NOT NULL,
    hangup INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS calls_by_instance ON calls(instance_id);
"""
_V7 = _ACCESS_KEYS + _CALLS

_V8 = """
ALTER TABLE conversations ADD COLUMN next_turn_index INTEGER NOT NULL DEFAULT 0;
UPDATE conversations SET next_turn_index = (
    SELECT COALESCE(MAX(t.turn_index) + 1, 0) FROM turns t WHERE t.conversation_id = conversations.id
);
ALTER TABLE turns ADD COLUMN audio_first INTEGER NOT NULL DEFAULT 0;
"""

_V9 = SEARCH_WORDS_ONLY

_V10 = _CALLS

# (A flag beside role, not a wider CHECK on it: SQLite cannot alter a CHECK short of rebuilding turns.)
_V11 = "ALTER TABLE turns ADD COLUMN from_system INTEGER NOT NULL DEFAULT 0;"

Migration = str | dict[str, str]  # one script, or one per Sql.kind
# MIGRATIONS[i] migrates from version i to i + 1.
MIGRATIONS: list[Migration] = [_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10, _V11]
SCHEMA_VERSION = len(MIGRATIONS)


def _statements(migration: Migration, sql: Sql) -> list[str]:
    """A migration's statements in `sql`'s dialect, one by one. Split where sqlite3 sees a
    complete statement, not at every ";": a trigger's body holds ";" of its own."""
    script = migration[sql.kind] if isinstance(migration, dict) else migration
    statements, statement = [], ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            statements.append(statement)
            statement = ""
    if statement.strip():
        statements.append(statement)
    return [sql.ddl(s.strip().rstrip(";")) for s in statements if s.strip()]


def newer_schema_message(where: str, found: int) -> str:
    """`where`: the database as logs show it (no password). The URL may come from the
    environment, which wins over storage.url, so the hint names both."""
    return (
        f"{where}: database schema version {found} is newer than this kimiaudio knows ({SCHEMA_VERSION}); "
        f"upgrade kimiaudio or point {DATABASE_URL_ENV}, storage.url or storage.data_dir at another database"
    )


def migrate(sql: Sql, where: str) -> int:
    """Bring the schema to SCHEMA_VERSION (of the database `where` names); returns the version found before."""
    with sql.migration_lock():
        found = sql.schema_version()
        if found > SCHEMA_VERSION:
            raise KimiAudioError(newer_schema_message(where, found))
        for version in range(found, SCHEMA_VERSION):
            with sql.atomic():
                for statement in _statements(MIGRATIONS[version], sql):
                    sql.execute(statement)
                sql.set_schema_version(version + 1)
    return found


# The primary result codes of a file that opens but cannot be written (a full disk makes the WAL
# index, the -shm file, fail to grow: SQLITE_IOERR_SHMSIZE): the disk, not the file's content.
_CANNOT_WRITE = {sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY}


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
        migrate(SqliteSql(sqlite_utils.Database(conn)), str(path))
    except sqlite3.DatabaseError as exc:
        conn.close()
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _CANNOT_WRITE:
            raise KimiAudioError(
                f"{path}: the conversation database (or its -wal or -shm file beside it) cannot be "
                f"written ({exc}); is its disk full?"
            ) from None
        raise KimiAudioError(f"{path}: not a usable conversation database ({exc})") from None
    except BaseException:
        conn.close()
        raise
    return sqlite_utils.Database(conn)


# Rows whose parent is gone (a foreign key not enforced, or broken): (what, the query counting them).
_ORPHANS = [
    (
        "turns without a conversation",
        "SELECT COUNT(*) FROM turns t LEFT JOIN conversations c ON c.id = t.conversation_id WHERE c.id IS NULL",
    ),
    (
        "turn audio without a turn",
        "SELECT COUNT(*) FROM turn_audio a LEFT JOIN turns t ON t.id = a.turn_id WHERE t.id IS NULL",
    ),
    (
        "heard audio parts without a turn",
        "SELECT COUNT(*) FROM turn_audio_parts p LEFT JOIN turns t ON t.id = p.turn_id WHERE t.id IS NULL",
    ),
    (
        "leases without a conversation",
        "SELECT COUNT(*) FROM leases l LEFT JOIN conversations c ON c.id = l.conversation_id WHERE c.id IS NULL",
    ),
]


def integrity_problems(sql: Sql) -> list[str]:
    """What the checks find (empty: all is well): on SQLite `PRAGMA integrity_check` and
    `foreign_key_check`; on both, rows whose parent row is gone."""
    problems = []
    if sql.kind == "sqlite":
        problems += [row[0] for row in sql.execute("PRAGMA integrity_check").fetchall() if row[0] != "ok"]
        problems += [f"foreign key: {tuple(row)}" for row in sql.execute("PRAGMA foreign_key_check").fetchall()]
    for what, query in _ORPHANS:
        count = sql.execute(query).fetchone()[0]
        if count:
            problems.append(f"{count} {what}")
    return problems
