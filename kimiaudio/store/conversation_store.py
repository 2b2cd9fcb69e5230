"""Conversation store: the queries behind conversations, turns, turn audio and leases.

Two backends, one store (sql.py): the SQLite file under the data dir, or a PostgreSQL database
shared by several instances (postgres.py); `location` is the file's path or the
postgresql:// URL (location.py). All writes go through ONE writer thread, so an instance's
writes are serialised and the event loop never blocks on the database; reads run on a second
thread (SQLite: each thread owns a connection, WAL lets the reader read while the writer
writes; PostgreSQL: each call borrows a pooled connection). Every public method is a coroutine
to be awaited from the event loop. A database that does not answer raises
StoreUnavailableError.

The queries themselves, and how turns and their audio are laid out in rows, are in
conversation_rows.py; the threads in db_thread.py; the leases this instance holds, and the
writes made as a lease's holder, in its lease book (lease_book.py, over leases.py).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kimiaudio.audio import pcm16
from kimiaudio.errors import KimiAudioError
from kimiaudio.store.conversation_pages import PageEnd

# The queries, run on the writer or reader thread; the methods below of the same names await them.
from kimiaudio.store.conversation_rows import (
    StoredTurn,
    add_turn,
    audio_record,
    create_conversation,
    delete_conversation,
    get_conversation,
    json_or_none,
    list_conversations,
    load_history,
    turn_audio_wav,
    update_turn,
)
from kimiaudio.store.db_thread import DbThread, SqliteConnector
from kimiaudio.store.file_owner import FileOwner
from kimiaudio.store.heard_audio import append_part, join_leftover_parts
from kimiaudio.store.identifiers import check_turn, is_conversation_id, is_turn_index
from kimiaudio.store.lease_book import LeaseBook
from kimiaudio.store.leases import ConversationBusyError, drop_all_leases
from kimiaudio.store.location import is_postgres_url, shown
from kimiaudio.store.schema import integrity_problems
from kimiaudio.store.search import query_words, search_conversations

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

__all__ = ["ConversationStore", "StoredTurn"]


class ConversationStore:
    """Async access to the conversation database at `location` (see module docstring)."""

    def __init__(
        self,
        location: str | Path,
        *,
        lease_seconds: float = 10.0,
        clock: Callable[[], float] = time.time,
        instance_id: str | None = None,
    ):
        self.location = location if is_postgres_url(location) else Path(location)
        self.is_shared = is_postgres_url(location)
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.instance_id = instance_id or f"inst_{secrets.token_hex(8)}"
        self._pool: ConnectionPool | None = None  # PostgreSQL's
        self._threads: tuple[DbThread, DbThread] | None = None  # (writer, reader), from open() on
        self._probe: DbThread | None = None  # PostgreSQL: the health probe's thread
        self._owner: FileOwner | None = None  # SQLite: this process's hold on the file
        self.leases = LeaseBook(self)  # the leases this instance's sessions hold (lease_book.py)

    @property
    def _writer(self) -> DbThread:
        return self._open_threads()[0]

    @property
    def _reader(self) -> DbThread:
        return self._open_threads()[1]

    def _open_threads(self) -> tuple[DbThread, DbThread]:
        if self._threads is None:
            raise KimiAudioError("the conversation store is not open (await store.open() first)")
        return self._threads

    @property
    def shown(self) -> str:
        """Where the conversations are, for logs (no password)."""
        return shown(self.location)

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        if self.is_shared:
            from kimiaudio.store.postgres import PostgresConnector, check_and_migrate, open_pool

            # Off the event loop: connecting, migrating (maybe waiting for another instance's
            # migration) and filling the pool.
            url = str(self.location)
            await loop.run_in_executor(None, check_and_migrate, url)
            self._pool = await loop.run_in_executor(None, open_pool, url)
            connector = PostgresConnector(self._pool, url)
            self._threads = (DbThread(connector, "kimiaudio-db-writer"), DbThread(connector, "kimiaudio-db-reader"))
            # Its own thread: health probes answer while a query waits for a server gone away.
            self._probe = DbThread(connector, "kimiaudio-db-probe")
        else:
            path = Path(self.location)
            self._owner = FileOwner(path)
            self._owner.acquire()
            self._threads = (
                DbThread(SqliteConnector(path), "kimiaudio-db-writer"),
                DbThread(SqliteConnector(path), "kimiaudio-db-reader"),
            )
            # The writer opens first: it creates and migrates the schema the reader relies on.
            # One process owns the file: the leases of an earlier one (killed) are void.
            await self._writer.call(drop_all_leases)
        # Join the audio of answers a crash cut short, of conversations nobody holds (so readers see it whole).
        await self._writer.call(join_leftover_parts, self.clock())
        await self._reader.call(lambda db: None)
        self.leases.start()

    async def close(self) -> None:
        await self.leases.close()
        if self._threads is not None:
            writer, reader = self._threads
            await writer.close()
            await reader.close()
        if self._probe is not None:
            await self._probe.close()
        if self._pool is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._pool.close)
        if self._owner is not None:
            self._owner.release()

    async def write(self, fn: Callable, *args: Any) -> Any:
        """Run `fn(sql, *args)` on the writer thread (for the queries of other store modules)."""
        return await self._writer.call(fn, *args)

    async def read(self, fn: Callable, *args: Any) -> Any:
        """Run `fn(sql, *args)` on the reader thread."""
        return await self._reader.call(fn, *args)

    async def ping(self) -> None:
        """A cheap query: raises StoreUnavailableError unless the database answers."""
        await (self._probe or self._reader).call(lambda db: db.execute("SELECT 1").fetchone())

    async def append_heard(
        self,
        conversation_id: str,
        index: int,
        pcm: np.ndarray,
        text: str,
        codes: list[int] | None = None,
        timings: dict | None = None,
        *,
        holder: str | None = None,
    ) -> None:
        """Append `pcm` (24 kHz float, may be empty) to an answer's heard audio (heard_audio.py);
        set its text and (if given) the codes heard so far. `holder`: the session that must hold
        the conversation's lease (LeaseBook.write_turns)."""
        await self.leases.write_turns(
            conversation_id,
            holder,
            append_part,
            index,
            pcm16.to_bytes(pcm) if np.size(pcm) else b"",
            text,
            None if codes is None else [int(c) for c in codes],
            timings,
        )

    # ----- writes (writer thread) -----
    async def create_conversation(self, title: str = "") -> dict[str, Any]:
        return await self._writer.call(create_conversation, title)

    async def add_turn(
        self,
        conversation_id: str,
        role: str,
        text: str = "",
        *,
        text_tokens: list[int] | None = None,
        audio_tokens: list[int] | None = None,
        timings: dict[str, Any] | None = None,
        interrupted: bool = False,
        audio: np.ndarray | None = None,
        audio_first: bool = False,  # a user turn's text came after its audio
        holder: str | None = None,  # the session that must hold the conversation's lease (LeaseBook.write_turns)
    ) -> int:
        """Append a turn (and its audio) in one transaction; its index (never a deleted turn's).
        role "system": a system message, text only, kept as a user turn marked from_system."""
        if role not in ("user", "assistant", "system"):
            raise KimiAudioError(f"turn role must be 'user', 'assistant' or 'system', got {role!r}")
        if role == "system" and audio is not None:
            raise KimiAudioError("a system turn is text only")
        fields = {
            "role": "user" if role == "system" else role,
            "text": text,
            "text_tokens": json_or_none(text_tokens),
            "audio_tokens": json_or_none(audio_tokens),
            "timings": json.dumps(timings or {}),
            "interrupted": int(interrupted),
            "audio_first": int(audio_first),
        }
        if role == "system":  # (the column's default says the others)
            fields["from_system"] = 1
        return await self.leases.write_turns(conversation_id, holder, add_turn, fields, audio_record(audio, role))

    async def update_turn(
        self,
        conversation_id: str,
        index: int,
        *,
        text: str | None = None,
        text_tokens: list[int] | None = None,
        audio_tokens: list[int] | None = None,
        timings: dict[str, Any] | None = None,
        interrupted: bool | None = None,
        audio: np.ndarray | None = None,
        transcript: str | None = None,
        holder: str | None = None,
    ) -> None:
        """Change the given fields of a stored turn (None = leave as it is; audio with no samples
        removes the turn's audio; transcript: a spoken user turn's words; holder: the session
        that must hold the conversation's lease, LeaseBook.write_turns)."""
        check_turn(conversation_id, index)
        fields: dict[str, Any] = {}
        if text is not None:
            fields["text"] = text
        if text_tokens is not None:
            fields["text_tokens"] = json.dumps(list(text_tokens))
        if audio_tokens is not None:
            fields["audio_tokens"] = json.dumps(list(audio_tokens))
        if timings is not None:
            fields["timings"] = json.dumps(timings)
        if interrupted is not None:
            fields["interrupted"] = int(interrupted)
        if transcript is not None:
            fields["transcript"] = transcript
        await self.leases.write_turns(conversation_id, holder, update_turn, index, fields, audio)

    async def delete_conversation(self, conversation_id: str) -> bool:
        """False if there is none; ConversationBusyError while a live session holds it (one of
        this instance that is closing is waited for: lease_book.py)."""
        if not is_conversation_id(conversation_id):
            return False
        try:
            return await self._writer.call(delete_conversation, conversation_id, self.clock())
        except ConversationBusyError:
            if not await self.leases.closed(conversation_id):
                raise
            return await self._writer.call(delete_conversation, conversation_id, self.clock())

    async def integrity_problems(self) -> list[str]:
        """What the database's integrity checks find wrong (empty: all is well; schema.py)."""
        return await self._reader.call(integrity_problems)

    # ----- reads (reader thread) -----
    async def list_conversations(self, limit: int = 100, q: str = "", after: PageEnd | None = None) -> list[dict]:
        """The newest conversations, older than `after` (conversation_pages.py); with `q`, those
        where every word of it was said in one turn (search.py; SearchQueryError: too long)."""
        words = query_words(q)
        if words:
            return await self._reader.call(search_conversations, words, limit, after)
        return await self._reader.call(list_conversations, limit, after)

    async def get_conversation(self, conversation_id: str) -> dict[str, Any] | None:
        """The conversation with its turns (no audio), or None if there is no such id."""
        if not is_conversation_id(conversation_id):
            return None
        return await self._reader.call(get_conversation, conversation_id)

    async def turn_audio_wav(self, conversation_id: str, index: int) -> bytes | None:
        if not (is_conversation_id(conversation_id) and is_turn_index(index)):
            return None
        return await self._reader.call(turn_audio_wav, conversation_id, index)

    async def load_history(self, conversation_id: str) -> list[StoredTurn] | None:
        """Every turn of a conversation with its audio decoded, or None if no such id."""
        if not is_conversation_id(conversation_id):
            return None
        return await self._reader.call(load_history, conversation_id)
