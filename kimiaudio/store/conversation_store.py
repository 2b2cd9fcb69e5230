"""Conversation store: the queries behind conversations, turns and turn audio.

All writes go through ONE writer thread (a single-thread executor owning its own connection),
so writes are serialised and the event loop never blocks on SQLite. Reads run on a second
single-thread executor with its own connection; WAL lets it read while the writer writes.
Every public method is a coroutine to be awaited from the event loop.

The queries themselves, and how turns and their audio are laid out in rows, are in
conversation_rows.py; the threads in db_thread.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from kimiaudio.audio import pcm16
from kimiaudio.errors import KimiAudioError
# The queries, run on the writer or reader thread; the methods below of the same names await them.
from kimiaudio.store.conversation_rows import (StoredTurn, add_turn, audio_record, create_conversation,
                                               delete_conversation, get_conversation, json_or_none,
                                               list_conversations, load_history, turn_audio_wav, update_turn)
from kimiaudio.store.db_thread import DbThread
from kimiaudio.store.heard_audio import append_part, join_leftover_parts
from kimiaudio.store.identifiers import check_turn, is_conversation_id, is_turn_index
from kimiaudio.store.schema import integrity_problems
from kimiaudio.store.search import query_words, search_conversations

__all__ = ["ConversationStore", "StoredTurn"]


class ConversationStore:
    """Async access to the conversation database at `path` (see module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._writer = DbThread(self.path, "kimiaudio-db-writer")
        self._reader = DbThread(self.path, "kimiaudio-db-reader")

    async def open(self) -> None:
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

    async def append_heard(self, conversation_id: str, index: int, pcm: np.ndarray, text: str,
                           codes: list[int] | None = None, timings: dict | None = None) -> None:
        """Append `pcm` (24 kHz float, may be empty) to an answer's heard audio (heard_audio.py);
        set its text and (if given) the codes heard so far."""
        await self.write(append_part, conversation_id, index, pcm16.to_bytes(pcm) if np.size(pcm) else b"", text,
                         None if codes is None else [int(c) for c in codes], timings)

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
    ) -> int:
        """Append a turn (and its audio) in one transaction; returns its index."""
        if role not in ("user", "assistant"):
            raise KimiAudioError(f"turn role must be 'user' or 'assistant', got {role!r}")
        fields = {
            "role": role,
            "text": text,
            "text_tokens": json_or_none(text_tokens),
            "audio_tokens": json_or_none(audio_tokens),
            "timings": json.dumps(timings or {}),
            "interrupted": int(interrupted),
        }
        blob = audio_record(audio, role)
        return await self._writer.call(add_turn, conversation_id, fields, blob)

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
    ) -> None:
        """Change the given fields of a stored turn (None = leave as it is; audio with no samples
        removes the turn's audio; transcript: a spoken user turn's words)."""
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
        await self._writer.call(update_turn, conversation_id, index, fields, audio)

    async def delete_conversation(self, conversation_id: str) -> bool:
        if not is_conversation_id(conversation_id):
            return False
        return await self._writer.call(delete_conversation, conversation_id)

    async def integrity_problems(self) -> list[str]:
        """What `PRAGMA integrity_check` and `foreign_key_check` find wrong (empty: all is well)."""
        return await self._reader.call(integrity_problems)

    # ----- reads (reader thread) -----
    async def list_conversations(self, limit: int = 100, q: str = "") -> list[dict[str, Any]]:
        """The newest conversations; with `q`, those where every word of it was said (a user's
        transcript or text, an assistant's text; search.py). Raises SearchQueryError for a
        query too long to use."""
        words = query_words(q)
        if words:
            return await self._reader.call(search_conversations, words, limit)
        return await self._reader.call(list_conversations, limit)

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
