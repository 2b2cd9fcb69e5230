"""A SQLite file damaged on disk (a page that no longer reads as SQLite's): the queries that
reach it fail with a StoreUnavailableError that names the file and how to recover it (the
server's 503, never a 500 with a traceback), logged once; the rest of the file still serves."""

from __future__ import annotations

import logging

import numpy as np

from kimiaudio.errors import StoreUnavailableError
from kimiaudio.store import ConversationStore

PAGE = 4096  # SQLite's default page size


def _noise(seconds: float, sr: int, seed: int) -> np.ndarray:
    # Noise, not a tone: the stored audio does not compress, so each turn spans many pages.
    return (0.3 * np.random.default_rng(seed).standard_normal(int(seconds * sr))).astype(np.float32)


async def test_damaged_pages_are_a_clear_unavailable_error(tmp_path, caplog):
    path = tmp_path / "k.db"
    store = ConversationStore(path)
    await store.open()
    ids = []
    for i in range(12):
        conv = await store.create_conversation(f"c{i}")
        await store.add_turn(conv["id"], "user", f"turn {i}", audio=_noise(1.0, 16000, i))
        ids.append(conv["id"])
    await store.close()
    data = bytearray(path.read_bytes())
    pages = len(data) // PAGE
    assert pages > 40
    for page in range(pages // 3, 2 * pages // 3):  # the middle third: audio pages, not the schema's
        data[page * PAGE : (page + 1) * PAGE] = b"\xff" * PAGE
    path.write_bytes(bytes(data))

    store = ConversationStore(path)
    await store.open()
    try:
        assert len(await store.list_conversations()) == 12  # the conversations' own rows still read
        caplog.set_level(logging.ERROR, logger="kimiaudio.store.db_thread")
        failures = []
        for conversation_id in ids:
            try:
                await store.turn_audio_wav(conversation_id, 0)
            except StoreUnavailableError as exc:
                failures.append(str(exc))
        assert failures, "no read reached a damaged page"
        assert all("is damaged" in f and str(path) in f and ".recover" in f for f in failures)
        damaged = [r for r in caplog.records if "is damaged" in r.getMessage()]
        assert len(damaged) == 1  # logged once, however many reads meet it
    finally:
        await store.close()
