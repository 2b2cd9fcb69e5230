"""One database thread: the store's writer and its reader are each one (the event loop never
waits on the database). A SQLite thread owns one connection (sqlite3 objects stay in one
thread); a PostgreSQL thread borrows a pooled connection for each call (postgres.py).

A SQLite file that cannot be used for a while (its disk full, the file read-only, locked by
another process past the busy timeout, an I/O error) is a StoreUnavailableError, as a
PostgreSQL server gone away is: the server answers 503 and the session talks on, and once
the cause is gone the same connection works again. A file found damaged (a page that does not
read as SQLite's) is one too, with what to do about it in its message, logged once by each
connection that meets it (the writer's, the reader's): it is not a bug of the server, and the
rest of the file may still serve."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import sqlite_utils

from kimiaudio.errors import StoreUnavailableError
from kimiaudio.store.schema import open_database
from kimiaudio.store.sql import SqliteSql

log = logging.getLogger(__name__)

# The primary result codes of a file that cannot be used now (any other error is a bug).
_UNAVAILABLE = {
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_CANTOPEN,
}
_DAMAGED = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}  # the file, not the moment


class SqliteConnector:
    """The SQLite file's connection of one thread, opened (and migrated) at its first call."""

    def __init__(self, path: Path):
        self._path = path
        self._db: sqlite_utils.Database | None = None  # touched only by the executor's thread
        self._damage_logged = False

    @contextlib.contextmanager
    def session(self) -> Iterator[SqliteSql]:
        if self._db is None:
            self._db = open_database(self._path)
        try:
            yield SqliteSql(self._db)
        except sqlite3.DatabaseError as exc:
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # (the extended code's primary part)
            if code in _DAMAGED:
                raise self._damaged(exc) from None
            if not isinstance(exc, sqlite3.OperationalError) or code not in _UNAVAILABLE:
                raise
            raise StoreUnavailableError(f"the conversation database {self._path} cannot be used: {exc}") from None

    def _damaged(self, exc: sqlite3.DatabaseError) -> StoreUnavailableError:
        message = (
            f"the conversation database {self._path} is damaged ({exc}): stop the server, then "
            f"restore it from a backup or recover its rows with "
            f"`sqlite3 {self._path} .recover | sqlite3 recovered.db` and start on that file"
        )
        if not self._damage_logged:
            self._damage_logged = True
            log.error("%s", message)
        return StoreUnavailableError(message)

    def close(self) -> None:
        if self._db is not None:
            self._db.conn.close()
            self._db = None


class DbThread:
    """A single-thread executor that runs `fn(sql, *args)` with the connector's connection."""

    def __init__(self, connector, name: str):
        self._connector = connector
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def _run(self, fn: Callable, args: tuple) -> Any:
        with self._connector.session() as sql:
            return fn(sql, *args)

    async def call(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._run, fn, args)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._connector.close)
        self._executor.shutdown(wait=True)
