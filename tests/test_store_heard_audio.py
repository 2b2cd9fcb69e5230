"""An answer's heard audio stored in parts while it plays (store/heard_audio.py): the final
record replaces the parts; after a crash, reopening the store joins them into the turn's WAV."""

import numpy as np

from kimiaudio.store import ConversationStore


async def test_parts_are_joined_on_reopen_and_dropped_by_the_final_record(store_location):
    store = ConversationStore(store_location)
    await store.open()
    conversation = (await store.create_conversation())["id"]
    await store.add_turn(conversation, "user", audio=np.full(16000, 0.1, np.float32))
    index = await store.add_turn(conversation, "assistant", "", interrupted=True)
    pcm = np.linspace(-0.5, 0.5, 36000, dtype=np.float32)
    await store.append_heard(conversation, index, pcm[:24000], "Hel")
    await store.append_heard(conversation, index, pcm[24000:], "Hello")
    turn = (await store.get_conversation(conversation))["turns"][index]
    assert turn["text"] == "Hello" and not turn["has_audio"]  # parts only, until the answer ends
    await store.close()  # as after kill -9: no final record was written

    store = ConversationStore(store_location)
    await store.open()
    turn = (await store.get_conversation(conversation))["turns"][index]
    assert turn["interrupted"] and turn["has_audio"] and turn["duration_s"] == 1.5
    history = await store.load_history(conversation)
    assert np.allclose(history[index].audio, pcm, atol=1e-4)
    await store.append_heard(conversation, index, pcm[:2400], "Hello!")
    await store.update_turn(conversation, index, interrupted=False, audio=pcm[:12000])
    await store.close()
    store = ConversationStore(store_location)
    await store.open()  # nothing left to join: the final record stands
    turn = (await store.get_conversation(conversation))["turns"][index]
    assert not turn["interrupted"] and turn["duration_s"] == 0.5
    await store.close()
