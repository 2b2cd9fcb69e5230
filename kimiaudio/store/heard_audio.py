"""An assistant answer's audio stored as it is heard: appended parts, joined when it ends.

While an answer plays, the session appends (ConversationStore.append_heard) what was heard
since the last write as one part
(raw 16-bit 24 kHz in turn_audio_parts) together with the answer's text so far, so a write
costs what was heard in that second, not the whole answer again. When the answer ends, the
usual update_turn writes the turn_audio WAV and drops the parts in the same transaction.
After a crash (kill -9), or when the final record could not be written (the database away as
the answer ended) or the answer's turn failed, the parts are all there is: they are joined into
the turn's WAV, so the conversation holds what was heard, when the session holding the
conversation lets it go or another takes it over (leases.py) and, for every conversation no
live session holds, when the store opens (`join_leftover_parts`).
On a shared database another instance's answer in progress is never touched: its conversation
is leased.
"""

from __future__ import annotations

import json
import time

from kimiaudio.audio import pcm16
from kimiaudio.audio.io import wav_bytes
from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE
from kimiaudio.store.sql import Sql
from kimiaudio.store.titles import retitle


def append_part(db: Sql, conversation_id: str, index: int, pcm: bytes, text: str, codes, timings) -> None:
    with db.atomic():
        row = db.execute(
            "SELECT id FROM turns WHERE conversation_id = ? AND turn_index = ?", [conversation_id, index]
        ).fetchone()
        if row is None:
            return  # deleted meanwhile: nothing to keep
        fields = {
            "text": text,
            **({"timings": json.dumps(timings)} if timings is not None else {}),
            **({"audio_tokens": json.dumps(codes)} if codes is not None else {}),
        }
        db.update("turns", row[0], fields)
        if pcm:
            part = db.execute(
                "SELECT COALESCE(MAX(part_index) + 1, 0) FROM turn_audio_parts WHERE turn_id = ?", [row[0]]
            ).fetchone()[0]
            db.insert("turn_audio_parts", {"turn_id": row[0], "part_index": part, "pcm": pcm})
        db.update("conversations", conversation_id, {"updated_at": time.time()})
        retitle(db, conversation_id)


def join_parts(db: Sql, turn_id: int) -> None:
    """The turn's parts become its WAV (inside the caller's transaction)."""
    parts = db.execute("SELECT pcm FROM turn_audio_parts WHERE turn_id = ? ORDER BY part_index", [turn_id]).fetchall()
    pcm = pcm16.to_float(b"".join(bytes(p[0]) for p in parts), f"the heard audio of turn {turn_id}")
    db.insert(
        "turn_audio",
        {
            "turn_id": turn_id,
            "sample_rate": SPEECH_OUTPUT_RATE,
            "num_samples": int(pcm.size),
            "wav": wav_bytes(pcm, SPEECH_OUTPUT_RATE),
        },
        upsert_key="turn_id",
    )
    db.execute("DELETE FROM turn_audio_parts WHERE turn_id = ?", [turn_id])


def join_conversation_parts(db: Sql, conversation_id: str) -> int:
    """Join the leftover parts of one conversation's turns (in the transaction that takes or
    releases its lease)."""
    turn_ids = [
        r[0]
        for r in db.execute(
            "SELECT DISTINCT p.turn_id FROM turn_audio_parts p JOIN turns t ON t.id = p.turn_id "
            "WHERE t.conversation_id = ?",
            [conversation_id],
        ).fetchall()
    ]
    for turn_id in turn_ids:
        join_parts(db, turn_id)
    return len(turn_ids)


def join_leftover_parts(db: Sql, now: float) -> int:
    """Join the parts of answers cut by a crash, in conversations no live session holds (no
    lease, or one expired at `now`); returns how many turns."""
    turn_ids = [
        r[0]
        for r in db.execute(
            "SELECT DISTINCT p.turn_id FROM turn_audio_parts p JOIN turns t ON t.id = p.turn_id "
            "LEFT JOIN leases l ON l.conversation_id = t.conversation_id "
            "WHERE l.conversation_id IS NULL OR l.expires_at < ?",
            [now],
        ).fetchall()
    ]
    for turn_id in turn_ids:
        with db.atomic():
            join_parts(db, turn_id)
    return len(turn_ids)
