"""Spoken answers of the chat completions API, kept for a while by id (table audio_answers).

OpenAI returns a spoken answer with an id and an expiry; a later request may put
`{"role": "assistant", "audio": {"id": ...}}` in its messages instead of the answer itself.
The server keeps what that turn needs as history (the transcript and the VQ codes) and the
audio (24 kHz WAV), until `expires_at`. Expired answers are deleted whenever one is added.
Queries run on the ConversationStore's writer and reader threads; on a shared database
an id resolves on every instance.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass

import numpy as np

from kimiaudio.audio.io import wav_bytes
from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE
from kimiaudio.store.conversation_store import ConversationStore
from kimiaudio.store.sql import Sql


@dataclass(frozen=True)
class AudioAnswer:
    id: str
    expires_at: float
    text: str
    audio_tokens: list[int]


def new_answer_id() -> str:
    return f"audio_{secrets.token_hex(12)}"


async def save_answer(
    store: ConversationStore, answer_id: str, text: str, audio_tokens: list[int], audio: np.ndarray, ttl_s: float
) -> AudioAnswer:
    now = time.time()
    expires_at = now + ttl_s
    record = {
        "id": answer_id,
        "created_at": now,
        "expires_at": expires_at,
        "text": text,
        "audio_tokens": json.dumps([int(t) for t in audio_tokens]),
        "sample_rate": SPEECH_OUTPUT_RATE,
        "wav": wav_bytes(np.asarray(audio, dtype=np.float32).reshape(-1), SPEECH_OUTPUT_RATE),
    }
    await store.write(_insert, record)
    return AudioAnswer(answer_id, expires_at, text, list(audio_tokens))


async def load_answer(store: ConversationStore, answer_id: str) -> AudioAnswer | None:
    """The answer with this id, or None if there is none or it has expired."""
    return await store.read(_select, answer_id, time.time())


def _insert(db: Sql, record: dict) -> None:
    with db.atomic():
        db.execute("DELETE FROM audio_answers WHERE expires_at < ?", [record["created_at"]])
        db.insert("audio_answers", record)


def _select(db: Sql, answer_id: str, now: float) -> AudioAnswer | None:
    row = db.execute(
        "SELECT id, expires_at, text, audio_tokens FROM audio_answers WHERE id = ? AND expires_at >= ?",
        [answer_id, now],
    ).fetchone()
    return None if row is None else AudioAnswer(row[0], row[1], row[2], json.loads(row[3]))
