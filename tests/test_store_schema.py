"""Schema and migrations of the conversation database (kimiaudio/store/schema.py)."""

import sqlite3

import pytest

from kimiaudio.errors import KimiAudioError
from kimiaudio.store import schema
from kimiaudio.store.schema import SCHEMA_VERSION, open_database


def test_new_database_is_migrated_wal_and_enforces_foreign_keys(tmp_path):
    db = open_database(tmp_path / "sub" / "k.db")
    assert db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert {"conversations", "turns", "turn_audio"} <= set(db.table_names())
    with pytest.raises(sqlite3.IntegrityError):
        db.conn.execute(
            "INSERT INTO turns (conversation_id, turn_index, role, created_at) VALUES ('nope', 0, 'user', 0)"
        )
    with pytest.raises(sqlite3.IntegrityError):
        db.conn.execute("INSERT INTO conversations (id, created_at, updated_at) VALUES ('c', 0, 0)")
        db.conn.execute("INSERT INTO turns (conversation_id, turn_index, role, created_at) VALUES ('c', 0, 'robot', 0)")
    db.close()


def test_reopen_keeps_data_and_does_not_remigrate(tmp_path):
    db = open_database(tmp_path / "k.db")
    db.conn.execute("INSERT INTO conversations (id, title, created_at, updated_at) VALUES ('a', 't', 1, 1)")
    db.close()
    db = open_database(tmp_path / "k.db")
    assert db.conn.execute("SELECT title FROM conversations WHERE id='a'").fetchone()[0] == "t"
    db.close()


def test_newer_schema_is_refused_with_a_clear_message(tmp_path):
    conn = sqlite3.connect(tmp_path / "k.db")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.close()
    with pytest.raises(KimiAudioError, match="newer than this kimiaudio") as refused:
        open_database(tmp_path / "k.db")
    assert str(refused.value).startswith(f"{tmp_path / 'k.db'}: database schema version")


def test_failed_migration_rolls_back_entirely(tmp_path, monkeypatch):
    bad = schema.MIGRATIONS + ["CREATE TABLE extra (x INTEGER); THIS IS NOT SQL"]
    monkeypatch.setattr(schema, "MIGRATIONS", bad)
    monkeypatch.setattr(schema, "SCHEMA_VERSION", len(bad))
    with pytest.raises(KimiAudioError):
        open_database(tmp_path / "k.db")
    conn = sqlite3.connect(tmp_path / "k.db")
    # Version 1 was committed on its own; the broken step 2 left nothing behind.
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(bad) - 1
    assert conn.execute("SELECT name FROM sqlite_master WHERE name='extra'").fetchone() is None
    conn.close()


def test_garbage_file_is_a_clear_error(tmp_path):
    (tmp_path / "k.db").write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(KimiAudioError, match="not a usable conversation database"):
        open_database(tmp_path / "k.db")
