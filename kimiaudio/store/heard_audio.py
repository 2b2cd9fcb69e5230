"""An assistant answer's audio stored as it is heard: appended parts, joined when it ends.

While an answer plays, the session appends (ConversationStore.append_heard) what was heard since the last write as one part
(raw 16-bit 24 kHz in turn_audio_parts) together with the answer's text so far, so a write
costs what was heard in that second, not the whole answer again. When the answer ends, the
usual update_turn writes the turn_audio WAV and drops the parts in the same transaction.
After a crash (kill -9) the parts are all there is: `join_leftover_parts` (run when the store
opens) turns them into the turn's WAV, so the conversation holds what was heard.
"""

from __future__ import annotations

import json
import time

import sqlite_utils

from kimiaudio.audio import pcm16
from kimiaudio.audio.io import wav_bytes
from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE


def append_part(db: sqlite_utils.Database, conversation_id: str, index: int, pcm: bytes, text: str, codes, timings) -> None:
    with db.atomic():
        row = db.execute("SELECT id FROM turns WHERE conversation_id = ? AND turn_index = ?",
                         [conversation_id, index]).fetchone()
        if row is None:
            return  # deleted meanwhile: nothing to keep
        fields = {"text": text, **({"timings": json.dumps(timings)} if timings is not None else {}),
                  **({"audio_tokens": json.dumps(codes)} if codes is not None else {})}
        db["turns"].update(row[0], fields)
        if pcm:
            part = db.execute("SELECT COALESCE(MAX(part_index) + 1, 0) FROM turn_audio_parts WHERE turn_id = ?",
                              [row[0]]).fetchone()[0]
            db["turn_audio_parts"].insert({"turn_id": row[0], "part_index": part, "pcm": pcm})
        db["conversations"].update(conversation_id, {"updated_at": time.time()})


def join_leftover_parts(db: sqlite_utils.Database) -> int:
    """Turn the parts of answers cut by a crash into their WAVs; returns how many turns."""
    turn_ids = [r[0] for r in db.execute("SELECT DISTINCT turn_id FROM turn_audio_parts").fetchall()]
    for turn_id in turn_ids:
        with db.atomic():
            parts = db.execute("SELECT pcm FROM turn_audio_parts WHERE turn_id = ? ORDER BY part_index",
                               [turn_id]).fetchall()
            pcm = pcm16.to_float(b"".join(p[0] for p in parts), f"the heard audio of turn {turn_id}")
            db["turn_audio"].insert({"turn_id": turn_id, "sample_rate": SPEECH_OUTPUT_RATE,
                                     "num_samples": int(pcm.size), "wav": wav_bytes(pcm, SPEECH_OUTPUT_RATE)},
                                    replace=True)
            db.execute("DELETE FROM turn_audio_parts WHERE turn_id = ?", [turn_id])
    return len(turn_ids)
