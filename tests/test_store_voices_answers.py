"""Voices and spoken answers in the store (store/voice_store.py, answer_store.py), on both backends."""

import numpy as np
import pytest

from kimiaudio.store.answer_store import load_answer, new_answer_id, save_answer
from kimiaudio.store.voice_store import VoiceExistsError, delete_voice, load_voices, save_voice, voice_names


async def test_voices_round_trip_lossless_and_names_are_unique(store):
    pcm = np.random.default_rng(0).uniform(-1, 1, 24000).astype(np.float32)
    saved = await save_voice(store, "alto", pcm, 24000, [5, 6, 7])
    with pytest.raises(VoiceExistsError, match="exists already"):
        await save_voice(store, "alto", pcm[:100], 24000, [1])
    await save_voice(store, "bass", pcm[:4800], 24000, [])
    alto, bass = await load_voices(store)
    assert alto.name == "alto" and np.array_equal(alto.pcm, pcm) and alto.codes == [5, 6, 7]
    assert alto.created_at == saved.created_at and bass.pcm.size == 4800
    assert set(await voice_names(store)) == {"alto", "bass"}
    assert await delete_voice(store, "alto") is True and await delete_voice(store, "alto") is False
    assert [v.name for v in await load_voices(store)] == ["bass"]


async def test_spoken_answers_resolve_until_they_expire(store):
    kept, expired = new_answer_id(), new_answer_id()
    await save_answer(store, expired, "old", [1], np.zeros(240, np.float32), ttl_s=-1.0)
    await save_answer(store, kept, "new", [2, 3], np.zeros(240, np.float32), ttl_s=60.0)
    assert await load_answer(store, expired) is None  # past its expiry (and deleted by the later insert)
    answer = await load_answer(store, kept)
    assert (answer.text, answer.audio_tokens) == ("new", [2, 3])
    assert await load_answer(store, "audio_nope") is None
    count = await store.read(lambda db: db.execute("SELECT COUNT(*) FROM audio_answers").fetchone()[0])
    assert count == 1
