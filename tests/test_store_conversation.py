"""Conversation store queries (kimiaudio/store/conversation_store.py), on both backends."""

import asyncio
import io

import numpy as np
import pytest
import soundfile as sf

from kimiaudio.errors import KimiAudioError
from kimiaudio.store import ConversationBusyError, ConversationNotFoundError, ConversationStore, get_turn


def _tone(seconds, sr, freq=220.0):
    t = np.arange(int(seconds * sr)) / sr
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


async def test_conversation_ids_are_unguessable(store):
    a = await store.create_conversation()
    b = await store.create_conversation()
    assert a["id"] != b["id"] and len(a["id"]) >= 20
    assert set(a["id"]) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


async def test_turns_round_trip_with_audio_at_their_rates(store):
    conv = await store.create_conversation()
    user = _tone(1.0, 16000)
    reply = _tone(0.5, 24000, 440.0)
    i0 = await store.add_turn(conv["id"], "user", audio=user, audio_tokens=[1, 2, 3], timings={"speech_s": 1.0})
    i1 = await store.add_turn(
        conv["id"], "assistant", "Hello there, how are you?", text_tokens=[5, 6], audio_tokens=[7, 8], audio=reply
    )
    assert (i0, i1) == (0, 1)
    got = await store.get_conversation(conv["id"])
    assert got["title"] == "Hello there, how are you?"
    t0, t1 = got["turns"]
    assert (t0["role"], t0["audio_tokens"], t0["timings"], t0["has_audio"]) == (
        "user",
        [1, 2, 3],
        {"speech_s": 1.0},
        True,
    )
    assert t0["duration_s"] == pytest.approx(1.0)
    assert (t1["role"], t1["text_tokens"], t1["audio_tokens"], t1["interrupted"]) == (
        "assistant",
        [5, 6],
        [7, 8],
        False,
    )
    assert t1["duration_s"] == pytest.approx(0.5)

    pcm, sr = sf.read(io.BytesIO(await store.turn_audio_wav(conv["id"], 1)), dtype="float32")
    assert sr == 24000 and np.max(np.abs(pcm - reply)) < 1.0 / 16000
    pcm, sr = sf.read(io.BytesIO(await store.turn_audio_wav(conv["id"], 0)), dtype="float32")
    assert sr == 16000 and pcm.shape == user.shape
    assert await store.turn_audio_wav(conv["id"], 7) is None

    history = await store.load_history(conv["id"])
    assert [h.role for h in history] == ["user", "assistant"]
    assert history[0].sample_rate == 16000 and np.max(np.abs(history[0].audio - user)) < 1.0 / 16000
    assert history[1].text == "Hello there, how are you?"


async def test_update_marks_interrupted_and_replaces_audio(store):
    conv = await store.create_conversation()
    await store.add_turn(conv["id"], "user", audio=_tone(0.5, 16000))
    await store.add_turn(conv["id"], "assistant", "long answer", audio=_tone(2.0, 24000), audio_tokens=list(range(25)))
    await store.update_turn(conv["id"], 1, interrupted=True, audio=_tone(0.4, 24000), audio_tokens=list(range(5)))
    turn = (await store.get_conversation(conv["id"]))["turns"][1]
    assert turn["interrupted"] is True and turn["audio_tokens"] == list(range(5))
    assert turn["duration_s"] == pytest.approx(0.4)
    with pytest.raises(KimiAudioError, match="no turn 9"):
        await store.update_turn(conv["id"], 9, text="x")


async def test_unknown_conversation(store):
    assert await store.get_conversation("nope") is None
    assert await store.load_history("nope") is None
    assert await store.delete_conversation("nope") is False
    with pytest.raises(ConversationNotFoundError, match="no conversation with id 'nope'"):
        await store.add_turn("nope", "user")
    conv = await store.create_conversation()
    with pytest.raises(KimiAudioError, match="role"):
        await store.add_turn(conv["id"], "narrator")
    with pytest.raises(KimiAudioError, match="system turn is text only"):
        await store.add_turn(conv["id"], "system", "Be brief.", audio=np.zeros(160, np.float32))


async def test_a_system_turn_reads_back_as_system(store):
    conv = await store.create_conversation()
    turns = [("system", "Be brief."), ("user", "Hi."), ("assistant", "Hello.")]
    for role, text in turns:
        await store.add_turn(conv["id"], role, text)
    listed = (await store.get_conversation(conv["id"]))["turns"]
    assert [(t["role"], t["text"]) for t in listed] == turns
    assert [t.role for t in await store.load_history(conv["id"])] == ["system", "user", "assistant"]
    assert (await get_turn(store, conv["id"], 0)).role == "system"


async def test_concurrent_writes_get_distinct_indices(store):
    conv = await store.create_conversation()
    indices = await asyncio.gather(*(store.add_turn(conv["id"], "user", f"t{i}") for i in range(40)))
    assert sorted(indices) == list(range(40))
    listed = await store.list_conversations()
    assert listed[0]["id"] == conv["id"] and listed[0]["num_turns"] == 40


async def test_a_conversation_a_live_session_holds_is_not_deleted(store):
    """Deleting it under the session would lose that session's next turn (not found)."""
    conv = await store.create_conversation()
    await store.add_turn(conv["id"], "user", "hi")
    await store.leases.acquire(conv["id"], "sess_a")
    with pytest.raises(ConversationBusyError) as info:
        await store.delete_conversation(conv["id"])
    assert info.value.retry_after_s >= 1
    await store.add_turn(conv["id"], "user", "still here")
    await store.leases.release(conv["id"], "sess_a")
    assert await store.delete_conversation(conv["id"]) is True


async def test_a_closing_session_is_waited_for_not_refused(store, monkeypatch):
    """A session holding the conversation is refused to another at once; once it is closing
    (its client gone, what was heard still being stored), the other waits for its release and
    takes the conversation then (a client reconnecting at once); one that never lets it go
    within the wait leaves the other refused, as before."""
    from kimiaudio.store.leases import acquire_row

    conv = await store.create_conversation()
    await store.leases.acquire(conv["id"], "sess_a")
    with pytest.raises(ConversationBusyError):
        await store.leases.acquire(conv["id"], "sess_b")
    store.leases.closing(conv["id"], "sess_a")
    refused = asyncio.Event()
    write = store.write

    async def noting_refusals(fn, *args):
        result = await write(fn, *args)
        if fn is acquire_row and result is not None:
            refused.set()
        return result

    monkeypatch.setattr(store, "write", noting_refusals)
    opening = asyncio.create_task(store.leases.acquire(conv["id"], "sess_b"))
    await refused.wait()  # the database said the conversation is held ...
    assert not opening.done()  # ... and sess_b waits for sess_a instead of failing
    await store.leases.release(conv["id"], "sess_a")
    await opening
    assert (conv["id"], "sess_b") in store.leases.held()
    # sess_b closing, never released within the wait: sess_c is refused after it.
    store.leases.closing(conv["id"], "sess_b")
    store.leases.closing_wait_s = 0.01
    with pytest.raises(ConversationBusyError):
        await store.leases.acquire(conv["id"], "sess_c")
    await store.leases.release(conv["id"], "sess_b")


async def test_a_delete_waits_for_a_closing_session_not_refused(store, monkeypatch):
    """A user deleting the conversation they just hung up: the session closing (what was heard
    still being stored) still holds it; the delete waits for its release and deletes it then,
    as an opening does, instead of a 409 telling to retry in the lease's seconds."""
    from kimiaudio.store import conversation_store

    conv = await store.create_conversation()
    await store.add_turn(conv["id"], "user", "hi")
    await store.leases.acquire(conv["id"], "sess_a")
    store.leases.closing(conv["id"], "sess_a")
    refused, loop = asyncio.Event(), asyncio.get_running_loop()
    delete = conversation_store.delete_conversation

    def noting_refusals(db, *args):  # (on the store's writer thread)
        try:
            return delete(db, *args)
        except ConversationBusyError:
            loop.call_soon_threadsafe(refused.set)
            raise

    monkeypatch.setattr(conversation_store, "delete_conversation", noting_refusals)
    deleting = asyncio.create_task(store.delete_conversation(conv["id"]))
    await refused.wait()  # the database said the conversation is held ...
    assert not deleting.done()  # ... and the delete waits for sess_a instead of failing
    await store.add_turn(conv["id"], "assistant", "what was heard")  # (sess_a storing its answer)
    await store.leases.release(conv["id"], "sess_a")
    assert await deleting is True
    with pytest.raises(ConversationNotFoundError):
        await store.add_turn(conv["id"], "user", "gone")


async def test_the_title_is_the_first_answer_as_stored_now(store):
    """An answer is inserted at its first audio with the text there is by then, and grows as it
    plays: the title follows it, and later answers do not change it, unless it is cut to no
    words."""
    conv = await store.create_conversation()
    await store.add_turn(conv["id"], "user", "hi")
    index = await store.add_turn(conv["id"], "assistant", "", interrupted=True)
    assert (await store.get_conversation(conv["id"]))["title"] == ""
    await store.append_heard(conv["id"], index, _tone(0.1, 24000), "Hel")
    assert (await store.get_conversation(conv["id"]))["title"] == "Hel"
    await store.append_heard(conv["id"], index, _tone(0.1, 24000), "Hello there")
    await store.update_turn(conv["id"], index, text="Hello there, friend.", interrupted=False)
    await store.add_turn(conv["id"], "assistant", "A later answer.")
    assert (await store.get_conversation(conv["id"]))["title"] == "Hello there, friend."
    # The first answer cut to no words (nothing of it heard): the next answer's words are the title.
    await store.update_turn(conv["id"], index, text="")
    assert (await store.get_conversation(conv["id"]))["title"] == "A later answer."
    await store.update_turn(conv["id"], index + 1, text=" ")
    assert (await store.get_conversation(conv["id"]))["title"] == ""


async def test_a_conversation_gone_is_not_found_and_deleted_once(store):
    """A session opening a conversation deleted meanwhile is told it is not found (404), and of
    two deletes only one deletes."""
    conv = await store.create_conversation()
    assert await store.delete_conversation(conv["id"]) is True
    assert await store.delete_conversation(conv["id"]) is False
    with pytest.raises(ConversationNotFoundError) as info:
        await store.leases.acquire(conv["id"], "sess_a")
    assert info.value.code == "conversation_not_found"
    with pytest.raises(ConversationNotFoundError):
        await store.add_turn(conv["id"], "user", "hi")


def _count(db, table):
    return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


async def test_delete_cascades_to_turns_and_audio(store):
    conv = await store.create_conversation()
    keep = await store.create_conversation()
    await store.add_turn(conv["id"], "user", audio=_tone(0.2, 16000))
    await store.add_turn(keep["id"], "user", audio=_tone(0.2, 16000))
    assert await store.delete_conversation(conv["id"]) is True
    assert await store.read(_count, "turns") == 1 and await store.read(_count, "turn_audio") == 1
    assert await store.integrity_problems() == []
    assert [c["id"] for c in await store.list_conversations()] == [keep["id"]]


async def test_committed_data_survives_reopen(store_location):
    s = ConversationStore(store_location)
    await s.open()
    conv = await s.create_conversation()
    await s.add_turn(conv["id"], "user", audio=_tone(0.3, 16000))
    await s.close()
    s = ConversationStore(store_location)
    await s.open()
    history = await s.load_history(conv["id"])
    await s.close()
    assert len(history) == 1 and history[0].audio.shape == (4800,)


def test_kill_9_right_after_a_write_loses_nothing(store_location):
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = f"""
import asyncio, os, signal
import numpy as np
from kimiaudio.store import ConversationStore
async def main():
    s = ConversationStore({str(store_location)!r})
    await s.open()
    conv = await s.create_conversation()
    await s.add_turn(conv["id"], "user", audio=np.full(1600, 0.25, np.float32))
    print(conv["id"], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no close, no checkpoint
asyncio.run(main())
"""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert proc.returncode == -9, proc.stderr
    conversation_id = proc.stdout.strip()

    async def check():
        s = ConversationStore(store_location)
        await s.open()
        history = await s.load_history(conversation_id)
        await s.close()
        return history

    history = asyncio.run(check())
    assert len(history) == 1 and np.allclose(history[0].audio, 0.25, atol=1e-4)


def test_a_busy_conversation_says_the_wait_its_retry_after_gives():
    # The 409's Retry-After rounds the wait up to whole seconds; the message says the same.
    error = ConversationBusyError("c1", 9.2)
    assert "try again in 10 s" in str(error) and error.retry_after_s == 9.2
