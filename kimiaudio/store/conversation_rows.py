"""The conversation store's queries, run on its writer or reader thread (conversation_store.py)
against either backend (sql.py): conversations, turns and their audio as rows. Turn audio is a
16-bit WAV blob: user turns at
16 kHz (what the speech encoders take, so history can be re-encoded after a restart),
assistant turns at 24 kHz (what the vocoder made). Token lists and timings are JSON text."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from kimiaudio.audio.io import decode_audio_bytes, wav_bytes
from kimiaudio.audio.rates import SPEECH_INPUT_RATE, SPEECH_OUTPUT_RATE
from kimiaudio.errors import KimiAudioError
from kimiaudio.store.conversation_pages import NEWEST_FIRST, PageEnd, older_than
from kimiaudio.store.identifiers import new_conversation_id
from kimiaudio.store.leases import ConversationBusyError, ConversationNotFoundError
from kimiaudio.store.sql import Sql
from kimiaudio.store.titles import retitle


@dataclass
class StoredTurn:
    """One turn as the pipeline's history needs it (audio decoded, tokens parsed)."""

    index: int
    role: str  # "user" | "assistant" | "system" (a system message: text, prompted as a user's)
    text: str
    text_tokens: list[int] | None
    audio_tokens: list[int] | None
    timings: dict[str, Any]
    interrupted: bool
    created_at: float
    transcript: str | None = None  # a spoken user turn's words, once transcribed
    audio_first: bool = False  # a user turn's text came after its audio (the client's order)
    audio: np.ndarray | None = None
    sample_rate: int | None = None


def turn_dict(row: dict) -> dict[str, Any]:
    return {
        "index": row["turn_index"],
        "role": "system" if row["from_system"] else row["role"],
        "text": row["text"],
        "text_tokens": json.loads(row["text_tokens"]) if row["text_tokens"] else None,
        "audio_tokens": json.loads(row["audio_tokens"]) if row["audio_tokens"] else None,
        "timings": json.loads(row["timings"]) if row["timings"] else {},
        "interrupted": bool(row["interrupted"]),
        "created_at": row["created_at"],
        "transcript": row["transcript"],
        "audio_first": bool(row["audio_first"]),
    }


def json_or_none(tokens: list[int] | None) -> str | None:
    return None if tokens is None else json.dumps([int(t) for t in tokens])


def audio_record(audio: np.ndarray | None, role: str) -> dict[str, Any] | None:
    """The turn_audio row of `audio`; None for no audio (None, or no samples: a text answer,
    or an answer cut before anything was heard)."""
    if audio is None or np.size(audio) == 0:
        return None
    sample_rate = SPEECH_INPUT_RATE if role == "user" else SPEECH_OUTPUT_RATE  # replies as the pipeline streamed them
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    return {"sample_rate": sample_rate, "num_samples": int(audio.size), "wav": wav_bytes(audio, sample_rate)}


def as_stored(audio: np.ndarray, role: str) -> np.ndarray:
    """`audio` as the store gives it back: the samples of its 16-bit WAV (the same again if
    stored again). A session prompts these, so that a later session reopening the conversation
    prompts the same samples and the prefix cache serves the history the first one computed."""
    record = audio_record(audio, role)
    if record is None:
        return np.asarray(audio, dtype=np.float32).reshape(-1)
    return decode_audio_bytes(record["wav"], sr=record["sample_rate"], name=f"{role} audio")


def create_conversation(db: Sql, title: str) -> dict[str, Any]:
    now = time.time()
    record = {"id": new_conversation_id(), "title": title, "created_at": now, "updated_at": now}
    db.insert("conversations", record)
    return record


def add_turn(db: Sql, conversation_id: str, fields: dict, blob: dict | None) -> int:
    """The turn gets the conversation's next_turn_index: past every turn it has had, deleted
    ones included, so an index names one turn for good (a writer holding it never writes into
    a later turn)."""
    now = time.time()
    with db.atomic():
        # Locked (PostgreSQL) until the turn is in: two writers never take the same index.
        found = db.execute(
            "SELECT next_turn_index FROM conversations WHERE id = ?" + db.for_update, [conversation_id]
        ).fetchone()
        if found is None:
            raise ConversationNotFoundError(conversation_id)
        index = found[0]
        row = {"conversation_id": conversation_id, "turn_index": index, "created_at": now, **fields}
        turn_id = db.insert_returning_id("turns", row)
        if blob is not None:
            db.insert("turn_audio", {"turn_id": turn_id, **blob})
        db.update("conversations", conversation_id, {"updated_at": now, "next_turn_index": index + 1})
        if fields["role"] == "assistant":
            retitle(db, conversation_id)
    return index


def turn_row_id(db: Sql, conversation_id: str, index: int) -> int:
    row = db.execute(
        "SELECT id FROM turns WHERE conversation_id = ? AND turn_index = ?", [conversation_id, index]
    ).fetchone()
    if row is None:
        raise KimiAudioError(f"conversation {conversation_id!r} has no turn {index}")
    return row[0]


def update_turn(db: Sql, conversation_id: str, index: int, fields: dict, audio) -> None:
    with db.atomic():
        turn_id = turn_row_id(db, conversation_id, index)
        db.update("turns", turn_id, fields)
        role = db.execute("SELECT role FROM turns WHERE id = ?", [turn_id]).fetchone()[0]
        if audio is not None:
            db.execute("DELETE FROM turn_audio_parts WHERE turn_id = ?", [turn_id])  # superseded (heard_audio.py)
            record = audio_record(audio, role)
            if record is None:
                db.execute("DELETE FROM turn_audio WHERE turn_id = ?", [turn_id])
            else:
                db.insert("turn_audio", {"turn_id": turn_id, **record}, upsert_key="turn_id")
        db.update("conversations", conversation_id, {"updated_at": time.time()})
        if "text" in fields:
            if role == "assistant" and not fields["text"].strip():  # an answer cut to no words: no title
                db.update("conversations", conversation_id, {"title": ""})
            retitle(db, conversation_id)


def delete_conversation(db: Sql, conversation_id: str, now: float) -> bool:
    """Delete it unless a live session holds it (ConversationBusyError): that session's next turn
    would find it gone and be lost."""
    with db.atomic():
        held = db.execute(
            "SELECT expires_at FROM leases WHERE conversation_id = ? AND expires_at >= ?", [conversation_id, now]
        ).fetchone()
        if held is not None:
            raise ConversationBusyError(conversation_id, max(1.0, held[0] - now))
        # ON DELETE CASCADE removes its turns and their audio.
        cursor = db.execute("DELETE FROM conversations WHERE id = ?", [conversation_id])
    return cursor.rowcount > 0


def list_conversations(db: Sql, limit: int, after: PageEnd | None = None) -> list[dict[str, Any]]:
    condition, values = older_than(after)
    rows = db.execute(
        "SELECT c.id, c.title, c.created_at, c.updated_at, COUNT(t.id) AS num_turns "
        f"FROM conversations c LEFT JOIN turns t ON t.conversation_id = c.id WHERE {condition} "
        f"GROUP BY c.id {NEWEST_FIRST} LIMIT ?",
        [*values, limit],
    ).fetchall()
    keys = ("id", "title", "created_at", "updated_at", "num_turns")
    return [dict(zip(keys, row)) for row in rows]


def get_conversation(db: Sql, conversation_id: str) -> dict[str, Any] | None:
    rows = db.query("SELECT * FROM conversations WHERE id = ?", [conversation_id])
    if not rows:
        return None
    turns = []
    for row in db.query(
        "SELECT t.*, a.sample_rate, a.num_samples FROM turns t LEFT JOIN turn_audio a ON a.turn_id = t.id "
        "WHERE t.conversation_id = ? ORDER BY t.turn_index",
        [conversation_id],
    ):
        turn = turn_dict(row)
        turn["has_audio"] = row["sample_rate"] is not None
        turn["duration_s"] = row["num_samples"] / row["sample_rate"] if turn["has_audio"] else 0.0
        turns.append(turn)
    return {**rows[0], "turns": turns}


def turn_audio_wav(db: Sql, conversation_id: str, index: int) -> bytes | None:
    row = db.execute(
        "SELECT a.wav FROM turns t JOIN turn_audio a ON a.turn_id = t.id "
        "WHERE t.conversation_id = ? AND t.turn_index = ?",
        [conversation_id, index],
    ).fetchone()
    return None if row is None else bytes(row[0])


def load_history(db: Sql, conversation_id: str) -> list[StoredTurn] | None:
    if db.execute("SELECT 1 FROM conversations WHERE id = ?", [conversation_id]).fetchone() is None:
        return None
    turns = []
    for row in db.query(
        "SELECT t.*, a.wav, a.sample_rate "
        "FROM turns t LEFT JOIN turn_audio a ON a.turn_id = t.id "
        "WHERE t.conversation_id = ? ORDER BY t.turn_index",
        [conversation_id],
    ):
        turns.append(stored_turn(row))
    return turns


def stored_turn(row: dict) -> StoredTurn:
    """A turn's row joined with its audio's (wav, sample_rate: None without audio), decoded."""
    d, sr = turn_dict(row), row["sample_rate"]
    audio = decode_audio_bytes(row["wav"], sr=sr, name=f"turn {d['index']} audio") if sr else None
    return StoredTurn(**d, audio=audio, sample_rate=sr)
