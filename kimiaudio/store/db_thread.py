"""One SQLite connection owned by one thread: the store's writer and its reader are each one."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import sqlite_utils

from kimiaudio.store.schema import open_database


class DbThread:
    """A single-thread executor owning one connection (sqlite3 objects stay in one thread)."""

    def __init__(self, path: Path, name: str):
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._db: sqlite_utils.Database | None = None  # touched only by the executor's thread

    def _run(self, fn: Callable, args: tuple) -> Any:
        if self._db is None:
            self._db = open_database(self._path)
        return fn(self._db, *args)

    async def call(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._run, fn, args)

    def _close(self) -> None:
        if self._db is not None:
            self._db.conn.close()
            self._db = None

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._close)
        self._executor.shutdown(wait=True)
