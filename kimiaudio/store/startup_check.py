"""The database check `serve` runs before loading the model: the database named by the config
(location.py) is reachable, usable and migrated, or one KimiAudioError line says why not (a bad
URL, an unreachable server, a wrong password, a schema newer than this kimiaudio, a SQLite file
another process owns or this one may not write)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlite_utils

from kimiaudio.config import Config
from kimiaudio.errors import KimiAudioError
from kimiaudio.store.file_owner import FileOwner
from kimiaudio.store.location import database_location, is_postgres_url, shown
from kimiaudio.store.postgres import check_and_migrate
from kimiaudio.store.schema import open_database


def check_database(config: Config) -> str:
    """Check (and migrate) the configured database; where it is, for the banner."""
    location = database_location(config)
    if is_postgres_url(location):
        check_and_migrate(str(location))
    else:
        owner = FileOwner(Path(location))
        owner.acquire()  # (the store takes it again when the server starts)
        try:
            db = open_database(location)
            try:
                _check_writable(db, Path(location))
            finally:
                db.close()
        finally:
            owner.release()
    return shown(location)


def _check_writable(db: sqlite_utils.Database, path: Path) -> None:
    """A file this process may not write (its permissions, an immutable flag) opens, migrates
    (when it has nothing to migrate) and reads; only the store's first write, once the model
    has loaded, would fail. Writing the schema version it already has is a write that changes
    nothing."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    try:
        db.execute(f"PRAGMA user_version = {int(version)}")
    except sqlite3.OperationalError as exc:
        raise KimiAudioError(f"{path}: the conversation database cannot be written ({exc})") from None
