"""Voice prompts by name (table voices): what POST /api/voices added, kept across restarts.

A voice is stored as the inputs of its DiT prefix: the reference as float32 PCM at the
vocoder's rate (lossless, so a prefix recomputed later equals the first) and its 12.5 Hz
semantic codes. The device copy of the prefix is the pipeline's; this is the record it is
rebuilt from. Queries run on the ConversationStore's writer and reader threads.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from kimiaudio.errors import KimiAudioError
from kimiaudio.store.conversation_store import ConversationStore
from kimiaudio.store.sql import Sql


class VoiceExistsError(KimiAudioError):
    """A voice of that name is stored already."""


@dataclass(frozen=True)
class StoredVoice:
    name: str
    created_at: float
    sample_rate: int
    pcm: np.ndarray  # float32 [samples]
    codes: list[int]


async def save_voice(
    store: ConversationStore, name: str, pcm: np.ndarray, sample_rate: int, codes: list[int]
) -> StoredVoice:
    """Add a voice; VoiceExistsError if the name is taken."""
    pcm = np.ascontiguousarray(pcm, dtype="<f4").reshape(-1)
    created_at = time.time()
    record = {
        "name": name,
        "created_at": created_at,
        "sample_rate": int(sample_rate),
        "num_samples": int(pcm.size),
        "pcm": pcm.tobytes(),
        "codes": json.dumps([int(c) for c in codes]),
    }
    await store.write(_insert, record)
    return StoredVoice(name, created_at, sample_rate, pcm.astype(np.float32), [int(c) for c in codes])


async def load_voices(store: ConversationStore) -> list[StoredVoice]:
    return await store.read(_select_all)


async def voice_names(store: ConversationStore) -> dict[str, float]:
    """{name: created_at} of the stored voices: cheap (no audio), to notice another instance's
    additions and deletions."""
    return await store.read(_select_names)


async def delete_voice(store: ConversationStore, name: str) -> bool:
    """True if a voice of that name was deleted."""
    return await store.write(_delete, name)


def _insert(db: Sql, record: dict) -> None:
    try:
        db.insert("voices", record)
    except Exception as exc:
        if not db.is_unique_violation(exc):
            raise
        raise VoiceExistsError(f"a voice named {record['name']!r} exists already (delete it first)") from None


def _select_all(db: Sql) -> list[StoredVoice]:
    rows = db.execute("SELECT name, created_at, sample_rate, pcm, codes FROM voices ORDER BY name").fetchall()
    return [
        StoredVoice(name, created, rate, np.frombuffer(bytes(pcm), dtype="<f4").astype(np.float32), json.loads(codes))
        for name, created, rate, pcm, codes in rows
    ]


def _select_names(db: Sql) -> dict[str, float]:
    return dict(db.execute("SELECT name, created_at FROM voices").fetchall())


def _delete(db: Sql, name: str) -> bool:
    return db.execute("DELETE FROM voices WHERE name = ?", [name]).rowcount > 0
