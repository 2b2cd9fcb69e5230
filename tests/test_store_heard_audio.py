"""An answer's heard audio stored in parts while it plays (store/heard_audio.py): the final
record replaces the parts; after a crash, reopening the store joins them into the turn's WAV;
when the final record could not be written, the session's release of the conversation does."""

import numpy as np

from kimiaudio.store import ConversationStore

PCM = np.linspace(-0.5, 0.5, 36000, dtype=np.float32)


async def test_parts_are_joined_on_reopen_and_dropped_by_the_final_record(store_location):
    store = ConversationStore(store_location)
    await store.open()
    conversation = (await store.create_conversation())["id"]
    await store.add_turn(conversation, "user", audio=np.full(16000, 0.1, np.float32))
    index = await store.add_turn(conversation, "assistant", "", interrupted=True)
    await store.append_heard(conversation, index, PCM[:24000], "Hel")
    await store.append_heard(conversation, index, PCM[24000:], "Hello")
    turn = (await store.get_conversation(conversation))["turns"][index]
    assert turn["text"] == "Hello" and not turn["has_audio"]  # parts only, until the answer ends
    await store.close()  # as after kill -9: no final record was written

    store = ConversationStore(store_location)
    await store.open()
    turn = (await store.get_conversation(conversation))["turns"][index]
    assert turn["interrupted"] and turn["has_audio"] and turn["duration_s"] == 1.5
    history = await store.load_history(conversation)
    assert np.allclose(history[index].audio, PCM, atol=1e-4)
    await store.append_heard(conversation, index, PCM[:2400], "Hello!")
    await store.update_turn(conversation, index, interrupted=False, audio=PCM[:12000])
    await store.close()
    store = ConversationStore(store_location)
    await store.open()  # nothing left to join: the final record stands
    turn = (await store.get_conversation(conversation))["turns"][index]
    assert not turn["interrupted"] and turn["duration_s"] == 0.5
    await store.close()


async def _parts_left(store: ConversationStore, conversation: str) -> int:
    query = "SELECT COUNT(*) FROM turn_audio_parts p JOIN turns t ON t.id = p.turn_id WHERE t.conversation_id = ?"
    return await store.read(lambda db: db.execute(query, [conversation]).fetchone()[0])


async def _answer_heard_in_parts(store: ConversationStore, session: str) -> tuple[str, int]:
    """A conversation `session` holds, whose answer was stored as it played (PCM in two parts)
    and got no final record -> (the conversation, the answer's index)."""
    conversation = (await store.create_conversation())["id"]
    await store.leases.acquire(conversation, session)
    await store.add_turn(conversation, "user", audio=np.full(16000, 0.1, np.float32), holder=session)
    index = await store.add_turn(conversation, "assistant", "", interrupted=True, holder=session)
    await store.append_heard(conversation, index, PCM[:24000], "Hel", holder=session)
    await store.append_heard(conversation, index, PCM[24000:], "Hello", holder=session)
    return conversation, index


async def test_the_release_joins_the_parts_of_an_answer_whose_final_record_failed(store):
    # As when the database went away while the answer ended: its final record was never
    # written; the session went on (a later turn stored) and then let the conversation go.
    conversation, index = await _answer_heard_in_parts(store, "sess_a")
    await store.add_turn(conversation, "user", "and then?", holder="sess_a")
    assert not (await store.get_conversation(conversation))["turns"][index]["has_audio"]
    await store.leases.release(conversation, "sess_a")
    turn = (await store.get_conversation(conversation))["turns"][index]
    assert turn["interrupted"] and turn["has_audio"] and turn["duration_s"] == 1.5 and turn["text"] == "Hello"
    assert np.allclose((await store.load_history(conversation))[index].audio, PCM, atol=1e-4)
    assert await _parts_left(store, conversation) == 0


async def test_the_release_leaves_a_final_record_and_a_new_holders_parts_alone(store_location):
    now = [1_000_000.0]
    store = ConversationStore(store_location, lease_seconds=5.0, clock=lambda: now[0])
    await store.open()
    try:
        # The final record written (late, as after a truncate): no stale part may replace it.
        finished, index = await _answer_heard_in_parts(store, "sess_a")
        await store.update_turn(finished, index, interrupted=False, audio=PCM[:12000], holder="sess_a")
        await store.leases.release(finished, "sess_a")
        turn = (await store.get_conversation(finished))["turns"][index]
        assert not turn["interrupted"] and turn["duration_s"] == 0.5

        # Taken over by another session (which joined the first one's parts) now playing an
        # answer of its own: the first session's release is not its to make.
        taken, _ = await _answer_heard_in_parts(store, "sess_a")
        now[0] += 10.0
        await store.leases.acquire(taken, "sess_b")
        playing = await store.add_turn(taken, "assistant", "", interrupted=True, holder="sess_b")
        await store.append_heard(taken, playing, PCM[:2400], "Hi", holder="sess_b")
        await store.leases.release(taken, "sess_a")
        assert not (await store.get_conversation(taken))["turns"][playing]["has_audio"]
        assert await _parts_left(store, taken) == 1
    finally:
        await store.close()
