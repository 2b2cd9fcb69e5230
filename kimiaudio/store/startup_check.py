"""The database check `serve` runs before loading the model: the database named by the config
(location.py) is reachable, usable and migrated, or one KimiAudioError line says why not (a bad
URL, an unreachable server, a wrong password, a schema newer than this kimiaudio, a SQLite file
another process owns)."""

from __future__ import annotations

from pathlib import Path

from kimiaudio.config import Config
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
            open_database(location).close()
        finally:
            owner.release()
    return shown(location)
