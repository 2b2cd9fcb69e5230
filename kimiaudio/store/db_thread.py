"""One database thread: the store's writer and its reader are each one (the event loop never
waits on the database). A SQLite thread owns one connection (sqlite3 objects stay in one
thread); a PostgreSQL thread borrows a pooled connection for each call (postgres.py).

A SQLite file that cannot be used for a while (its disk full, the file read-only, locked by
another process past the busy timeout, an I/O error) is a StoreUnavailableError, as a
PostgreSQL server gone away is: the server answers 503 and the session talks on, and once
the cause is gone the same connection works again."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import sqlite_utils

from kimiaudio.errors import StoreUnavailableError
from kimiaudio.store.schema import open_database
from kimiaudio.store.sql import SqliteSql

# The primary result codes of a file that cannot be used now (any other error is a bug).
_UNAVAILABLE = {
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_CANTOPEN,
}


class SqliteConnector:
    """The SQLite file's connection of one thread, opened (and migrated) at its first call."""

    def __init__(self, path: Path):
        self._path = path
        self._db: sqlite_utils.Database | None = None  # touched only by the executor's thread

    @contextlib.contextmanager
    def session(self) -> Iterator[SqliteSql]:
        if self._db is None:
            self._db = open_database(self._path)
        try:
            yield SqliteSql(self._db)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF not in _UNAVAILABLE:  # (the extended code's primary part)
                raise
            raise StoreUnavailableError(f"the conversation database {self._path} cannot be used: {exc}") from None

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
