"""Conversation store: the queries behind conversations, turns and turn audio.

All writes go through ONE writer thread (a single-thread executor owning its own connection),
so writes are serialised and the event loop never blocks on SQLite. Reads run on a second
single-thread executor with its own connection; WAL lets it read while the writer writes.
Every public method is a coroutine to be awaited from the event loop.

Turn audio is stored as 16-bit WAV blobs: user turns at 16 kHz (what the speech encoders
take, so history can be re-encoded after a restart), assistant turns at 24 kHz (what the
vocoder made). Token lists and timings are JSON text.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import sqlite_utils

from kimiaudio.audio.io import decode_audio_bytes, wav_bytes
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.events import PCM_SAMPLE_RATE
from kimiaudio.store.identifiers import check_turn, is_conversation_id, is_turn_index, new_conversation_id
from kimiaudio.store.schema import integrity_problems, open_database

USER_SAMPLE_RATE = 16000
ASSISTANT_SAMPLE_RATE = PCM_SAMPLE_RATE  # replies are stored as the pipeline streamed them


@dataclass
class StoredTurn:
    """One turn as the pipeline's history needs it (audio decoded, tokens parsed)."""

    index: int
    role: str
    text: str
    text_tokens: list[int] | None
    audio_tokens: list[int] | None
    timings: dict[str, Any]
    interrupted: bool
    created_at: float
    audio: np.ndarray | None = None
    sample_rate: int | None = None


def _turn_dict(row: dict) -> dict[str, Any]:
    return {
        "index": row["turn_index"],
        "role": row["role"],
        "text": row["text"],
        "text_tokens": json.loads(row["text_tokens"]) if row["text_tokens"] else None,
        "audio_tokens": json.loads(row["audio_tokens"]) if row["audio_tokens"] else None,
        "timings": json.loads(row["timings"]) if row["timings"] else {},
        "interrupted": bool(row["interrupted"]),
        "created_at": row["created_at"],
    }


class _DbThread:
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


class ConversationStore:
    """Async access to the conversation database at `path` (see module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._writer = _DbThread(self.path, "kimiaudio-db-writer")
        self._reader = _DbThread(self.path, "kimiaudio-db-reader")

    async def open(self) -> None:
        from kimiaudio.store.heard_audio import join_leftover_parts

        # The writer opens first: it creates and migrates the schema the reader relies on,
        # and joins the audio of answers a crash cut short (so readers see it whole).
        await self._writer.call(join_leftover_parts)
        await self._reader.call(lambda db: None)

    async def close(self) -> None:
        await self._writer.close()
        await self._reader.close()

    async def write(self, fn: Callable, *args: Any) -> Any:
        """Run `fn(db, *args)` on the writer thread (for the queries of other store modules)."""
        return await self._writer.call(fn, *args)

    async def read(self, fn: Callable, *args: Any) -> Any:
        """Run `fn(db, *args)` on the reader thread."""
        return await self._reader.call(fn, *args)

    # ----- writes (writer thread) -----
    async def create_conversation(self, title: str = "") -> dict[str, Any]:
        return await self._writer.call(_create_conversation, title)

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
    ) -> int:
        """Append a turn (and its audio) in one transaction; returns its index."""
        if role not in ("user", "assistant"):
            raise KimiAudioError(f"turn role must be 'user' or 'assistant', got {role!r}")
        fields = {
            "role": role,
            "text": text,
            "text_tokens": _json_or_none(text_tokens),
            "audio_tokens": _json_or_none(audio_tokens),
            "timings": json.dumps(timings or {}),
            "interrupted": int(interrupted),
        }
        blob = _audio_record(audio, role)
        return await self._writer.call(_add_turn, conversation_id, fields, blob)

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
    ) -> None:
        """Change the given fields of a stored turn (None = leave as it is; audio with no samples
        removes the turn's audio)."""
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
        await self._writer.call(_update_turn, conversation_id, index, fields, audio)

    async def delete_conversation(self, conversation_id: str) -> bool:
        if not is_conversation_id(conversation_id):
            return False
        return await self._writer.call(_delete_conversation, conversation_id)

    async def integrity_problems(self) -> list[str]:
        """What `PRAGMA integrity_check` and `foreign_key_check` find wrong (empty: all is well)."""
        return await self._reader.call(integrity_problems)

    # ----- reads (reader thread) -----
    async def list_conversations(self, limit: int = 100) -> list[dict[str, Any]]:
        return await self._reader.call(_list_conversations, limit)

    async def get_conversation(self, conversation_id: str) -> dict[str, Any] | None:
        """The conversation with its turns (no audio), or None if there is no such id."""
        if not is_conversation_id(conversation_id):
            return None
        return await self._reader.call(_get_conversation, conversation_id)

    async def turn_audio_wav(self, conversation_id: str, index: int) -> bytes | None:
        if not (is_conversation_id(conversation_id) and is_turn_index(index)):
            return None
        return await self._reader.call(_turn_audio_wav, conversation_id, index)

    async def load_history(self, conversation_id: str) -> list[StoredTurn] | None:
        """Every turn of a conversation with its audio decoded, or None if no such id."""
        if not is_conversation_id(conversation_id):
            return None
        return await self._reader.call(_load_history, conversation_id)


def _json_or_none(tokens: list[int] | None) -> str | None:
    return None if tokens is None else json.dumps([int(t) for t in tokens])


def _audio_record(audio: np.ndarray | None, role: str) -> dict[str, Any] | None:
    """The turn_audio row of `audio`; None for no audio (None, or no samples: a text answer,
    or an answer cut before anything was heard)."""
    if audio is None or np.size(audio) == 0:
        return None
    sample_rate = USER_SAMPLE_RATE if role == "user" else ASSISTANT_SAMPLE_RATE
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    return {"sample_rate": sample_rate, "num_samples": int(audio.size), "wav": wav_bytes(audio, sample_rate)}


def _create_conversation(db: sqlite_utils.Database, title: str) -> dict[str, Any]:
    now = time.time()
    record = {"id": new_conversation_id(), "title": title, "created_at": now, "updated_at": now}
    with db.atomic():
        db["conversations"].insert(record)
    return record


def _add_turn(db: sqlite_utils.Database, conversation_id: str, fields: dict, blob: dict | None) -> int:
    now = time.time()
    with db.atomic():
        if db.execute("SELECT 1 FROM conversations WHERE id = ?", [conversation_id]).fetchone() is None:
            raise KimiAudioError(f"conversation {conversation_id!r} does not exist")
        index = db.execute(
            "SELECT COALESCE(MAX(turn_index) + 1, 0) FROM turns WHERE conversation_id = ?", [conversation_id]
        ).fetchone()[0]
        row = {"conversation_id": conversation_id, "turn_index": index, "created_at": now, **fields}
        turn_id = db["turns"].insert(row).last_pk
        if blob is not None:
            db["turn_audio"].insert({"turn_id": turn_id, **blob})
        updates: dict[str, Any] = {"updated_at": now}
        # A conversation is titled by the first words the assistant said in it.
        if fields["role"] == "assistant" and fields["text"].strip():
            title = db.execute("SELECT title FROM conversations WHERE id = ?", [conversation_id]).fetchone()[0]
            if not title:
                updates["title"] = _title_from(fields["text"])
        db["conversations"].update(conversation_id, updates)
    return index


def _title_from(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rsplit(" ", 1)[0] + "…"


def _turn_id(db: sqlite_utils.Database, conversation_id: str, index: int) -> int:
    row = db.execute(
        "SELECT id FROM turns WHERE conversation_id = ? AND turn_index = ?", [conversation_id, index]
    ).fetchone()
    if row is None:
        raise KimiAudioError(f"conversation {conversation_id!r} has no turn {index}")
    return row[0]


def _update_turn(db: sqlite_utils.Database, conversation_id: str, index: int, fields: dict, audio) -> None:
    with db.atomic():
        turn_id = _turn_id(db, conversation_id, index)
        if fields:
            db["turns"].update(turn_id, fields)
        if audio is not None:
            db.execute("DELETE FROM turn_audio_parts WHERE turn_id = ?", [turn_id])  # superseded (heard_audio.py)
            role = db.execute("SELECT role FROM turns WHERE id = ?", [turn_id]).fetchone()[0]
            record = _audio_record(audio, role)
            if record is None:
                db.execute("DELETE FROM turn_audio WHERE turn_id = ?", [turn_id])
            else:
                db["turn_audio"].insert({"turn_id": turn_id, **record}, replace=True)
        db["conversations"].update(conversation_id, {"updated_at": time.time()})


def _delete_conversation(db: sqlite_utils.Database, conversation_id: str) -> bool:
    with db.atomic():
        # ON DELETE CASCADE removes its turns and their audio.
        cursor = db.execute("DELETE FROM conversations WHERE id = ?", [conversation_id])
    return cursor.rowcount > 0


def _list_conversations(db: sqlite_utils.Database, limit: int) -> list[dict[str, Any]]:
    rows = db.execute(
        "SELECT c.id, c.title, c.created_at, c.updated_at, COUNT(t.id) AS num_turns "
        "FROM conversations c LEFT JOIN turns t ON t.conversation_id = c.id "
        "GROUP BY c.id ORDER BY c.updated_at DESC LIMIT ?",
        [limit],
    ).fetchall()
    keys = ("id", "title", "created_at", "updated_at", "num_turns")
    return [dict(zip(keys, row)) for row in rows]


def _get_conversation(db: sqlite_utils.Database, conversation_id: str) -> dict[str, Any] | None:
    rows = list(db["conversations"].rows_where("id = ?", [conversation_id]))
    if not rows:
        return None
    turns = []
    for row in db.query(
        "SELECT t.*, a.sample_rate, a.num_samples FROM turns t LEFT JOIN turn_audio a ON a.turn_id = t.id "
        "WHERE t.conversation_id = ? ORDER BY t.turn_index",
        [conversation_id],
    ):
        turn = _turn_dict(row)
        turn["has_audio"] = row["sample_rate"] is not None
        turn["duration_s"] = row["num_samples"] / row["sample_rate"] if turn["has_audio"] else 0.0
        turns.append(turn)
    return {**rows[0], "turns": turns}


def _turn_audio_wav(db: sqlite_utils.Database, conversation_id: str, index: int) -> bytes | None:
    row = db.execute(
        "SELECT a.wav FROM turns t JOIN turn_audio a ON a.turn_id = t.id "
        "WHERE t.conversation_id = ? AND t.turn_index = ?",
        [conversation_id, index],
    ).fetchone()
    return None if row is None else row[0]


def _load_history(db: sqlite_utils.Database, conversation_id: str) -> list[StoredTurn] | None:
    if db.execute("SELECT 1 FROM conversations WHERE id = ?", [conversation_id]).fetchone() is None:
        return None
    turns = []
    for row in db.query(
        "SELECT t.*, a.wav, a.sample_rate "
        "FROM turns t LEFT JOIN turn_audio a ON a.turn_id = t.id "
        "WHERE t.conversation_id = ? ORDER BY t.turn_index",
        [conversation_id],
    ):
        d = _turn_dict(row)
        sr = row["sample_rate"]
        audio = decode_audio_bytes(row["wav"], sr=sr, name=f"turn {d['index']} audio") if sr else None
        turns.append(StoredTurn(**d, audio=audio, sample_rate=sr))
    return turns
