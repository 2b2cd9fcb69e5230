"""One stored turn read or deleted by its index (kimiaudio/store/turn_by_index.py), on both
backends: an index names one turn for good, so deleting a turn leaves every other where it was
and no later turn takes its index; the deleted turn is gone from every read (the conversation,
its history, its audio, the search), and the conversation's title is taken again."""

import numpy as np
import psycopg
import pytest

from kimiaudio.errors import KimiAudioError
from kimiaudio.store import ConversationStore, delete_turn, get_turn, schema
from kimiaudio.store.postgres import check_and_migrate
from kimiaudio.store.schema import open_database


def _tone(seconds, sr, freq=220.0):
    t = np.arange(int(seconds * sr)) / sr
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


async def test_a_turn_is_read_whole_by_its_index(store):
    conv = (await store.create_conversation())["id"]
    spoken = _tone(0.5, 16000)
    user = await store.add_turn(conv, "user", "Which language is this?", audio=spoken, audio_first=True)
    await store.update_turn(conv, user, transcript="hello there")
    answer = await store.add_turn(conv, "assistant", "English.", audio=_tone(0.25, 24000), interrupted=True)

    turn = await get_turn(store, conv, user)
    assert (turn.index, turn.role, turn.text, turn.transcript, turn.audio_first) == (
        user,
        "user",
        "Which language is this?",
        "hello there",
        True,
    )
    assert turn.sample_rate == 16000 and np.max(np.abs(turn.audio - spoken)) < 1.0 / 16000
    turn = await get_turn(store, conv, answer)
    assert (turn.role, turn.interrupted, turn.sample_rate, turn.audio.size, turn.audio_first) == (
        "assistant",
        True,
        24000,
        6000,
        False,
    )
    assert (await store.get_conversation(conv))["turns"][0]["audio_first"] is True
    assert await get_turn(store, conv, 7) is None
    assert await get_turn(store, "nope", 0) is None and await get_turn(store, conv, -1) is None


async def test_deleting_a_turn_keeps_every_index_and_never_gives_its_own_again(store):
    conv = (await store.create_conversation())["id"]
    await store.add_turn(conv, "user", "Say the zebra word.")
    await store.add_turn(conv, "assistant", "Zebra crossing, of course.", audio=_tone(0.2, 24000))
    await store.add_turn(conv, "user", "And a second one?", audio=_tone(0.2, 16000))
    await store.add_turn(conv, "assistant", "Second answer here.")
    assert (await store.get_conversation(conv))["title"] == "Zebra crossing, of course."

    assert await delete_turn(store, conv, 1) is True
    assert await delete_turn(store, conv, 1) is False  # (once)
    stored = await store.get_conversation(conv)
    assert [t["index"] for t in stored["turns"]] == [0, 2, 3]
    assert stored["title"] == "Second answer here."  # the deleted answer's words are no title
    assert [t.index for t in await store.load_history(conv)] == [0, 2, 3]
    assert await store.turn_audio_wav(conv, 1) is None and await store.turn_audio_wav(conv, 2) is not None
    assert await store.list_conversations(q="zebra crossing") == []
    assert [c["num_turns"] for c in await store.list_conversations()] == [3]
    with pytest.raises(KimiAudioError, match="no turn 1"):  # a writer still holding it writes into no other turn
        await store.update_turn(conv, 1, text="late")

    assert await delete_turn(store, conv, 3) is True  # the newest: its index is not given again
    assert await store.add_turn(conv, "user", "Next.") == 4
    assert (await store.get_conversation(conv))["title"] == ""  # no answer is left
    assert await store.integrity_problems() == []
    assert await delete_turn(store, "nope", 0) is False


def _version_7_database(store_location) -> None:
    """A database at schema version 7 (before next_turn_index) holding a conversation of three
    turns, 0 to 2, written as that version wrote them."""
    turns = [("c1", index) for index in (0, 1, 2)]
    if isinstance(store_location, str):  # PostgreSQL
        check_and_migrate(store_location)
        with psycopg.connect(store_location, autocommit=True) as conn:
            conn.execute("INSERT INTO conversations (id, created_at, updated_at) VALUES ('c1', 0, 0)")
            for turn in turns:
                conn.execute(
                    "INSERT INTO turns (conversation_id, turn_index, role, created_at) VALUES (%s, %s, 'user', 0)", turn
                )
        return
    old = open_database(store_location)
    old.conn.execute("INSERT INTO conversations (id, created_at, updated_at) VALUES ('c1', 0, 0)")
    for turn in turns:
        old.conn.execute(
            "INSERT INTO turns (conversation_id, turn_index, role, created_at) VALUES (?, ?, 'user', 0)", turn
        )
    old.close()


async def test_the_migration_keeps_the_next_index_of_the_turns_already_stored(store_location, monkeypatch):
    """A conversation of a version 7 database gets the index after its last turn: deleting its
    newest turn then does not give that index again."""
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 7)
    _version_7_database(store_location)
    monkeypatch.undo()
    store = ConversationStore(store_location)
    await store.open()
    try:
        assert await delete_turn(store, "c1", 2) is True
        assert [await store.add_turn("c1", "user", "y"), await store.add_turn("c1", "assistant", "z")] == [3, 4]
        history = await store.load_history("c1")
        assert [turn.audio_first for turn in history] == [False] * 4
        assert [turn.role for turn in history] == ["user", "user", "user", "assistant"]  # old turns: no system one
    finally:
        await store.close()
