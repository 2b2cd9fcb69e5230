"""conversation.item.retrieve and conversation.item.delete, and the order of a user item's parts,
with the official `openai` client against a real server on the demo checkpoint (every event
checked against the SDK's models of the connection's shape):

- retrieve sends an item as the server holds it (and delete is answered), in either shape: a
  user text item; a user item of audio then text, its parts in that order and its audio the
  audio the session took, at the session's input rate; an answer with its transcript and the
  audio that was heard;
- delete takes items out of the conversation: the next prompt is that of a conversation that
  never had them (usage.input_tokens), and the stored conversation no longer lists them, the
  other turns keeping their indexes, on SQLite and on PostgreSQL;
- the answer in progress and the item it answers are refused deletion until it ends;
- a truncate sent after a delete of its item is taken after it, however long the delete waits
  in the queue or runs: it then names no item; a truncate of the answer playing cuts it at
  once, even behind a queued retrieve of it;
- retrieve and delete of an id that is no item of the conversation (unknown, deleted, of the
  conversation the session left) are errors naming the client's event;
- an item of audio then text is prompted audio first: its prompt is the one two items, the
  audio then the text, make (the prefix cache serves the second whole).
The order of events proves each absence: the session takes items, responses, retrieves and
deletes from one queue."""

import base64

import numpy as np
import pytest

from kimiaudio.audio import pcm16
from kimiaudio.audio.resampling import resample
from kimiaudio.config import Config

from helpers.realtime_events import Events
from helpers.realtime_sessions import answer_playing, client_of, connect, open_session, user_text
from helpers.waiting import eventually

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow

SAME_PCM16 = 3  # int16 steps between audio sent and read back (16-bit WAV storage rounds twice)


def assistant_text(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def spoken_then_written(audio: bytes, text: str) -> dict:
    content = [{"type": "input_audio", "audio": base64.b64encode(audio).decode()}, {"type": "input_text", "text": text}]
    return {"type": "message", "role": "user", "content": content}


def samples(b64: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype="<i2").astype(np.int32)


async def refused(events: Events, count: int, code: str, event_id: str) -> str:
    """The count-th error: its code and event_id as expected, naming item_id -> its message."""
    error = (await events.wait_for("error", count=count)).error
    assert (error.code, error.event_id, error.param) == (code, event_id, "item_id"), error
    return error.message


async def turns(http, conversation_id: str) -> list[tuple[int, str, str]]:
    stored = await (await http.get(f"/api/conversations/{conversation_id}")).json()
    return [(t["index"], t["role"], t["text"]) for t in stored["turns"]]


@pytest.mark.parametrize("api, rate", [("ga", 24000), ("beta", 16000)])
async def test_retrieve_sends_an_item_as_the_server_holds_it(v1_server, speech, openai_client, api, rate):
    sent = pcm16.to_bytes(resample(speech[0], 16000, rate))
    async with connect(openai_client, api) as conn:
        events = await open_session(conn, api, turn_detection=None, input_rate=rate)
        await conn.send({"type": "conversation.item.create", "item": user_text("Hello.", "item_text")})
        item = spoken_then_written(sent, "Which language is this?") | {"id": "item_spoken"}
        await conn.send({"type": "conversation.item.create", "item": item})
        await conn.send({"type": "response.create"})
        done = await events.wait_for("response.done")
        assert done.response.status in ("completed", "incomplete"), done.response.status_details
        answer = done.response.output[0]
        for item_id in ("item_text", "item_spoken", answer.id):
            await conn.send({"type": "conversation.item.retrieve", "item_id": item_id})
        await conn.send({"type": "conversation.item.retrieve", "item_id": "item_nope", "event_id": "ev_nope"})
        assert "'item_nope'" in await refused(events, 1, "item_not_found", "ev_nope")
        text, spoken, said = [e.item for e in events.of_type("conversation.item.retrieved")]
        await conn.send({"type": "conversation.item.delete", "item_id": "item_text"})
        assert (await events.wait_for("conversation.item.deleted")).item_id == "item_text"

    assert (text.id, text.role, [(p.type, p.text) for p in text.content]) == (
        "item_text",
        "user",
        [("input_text", "Hello.")],
    )
    assert [p.type for p in spoken.content] == ["input_audio", "input_text"]  # as the client gave them
    assert spoken.content[1].text == "Which language is this?" and spoken.content[0].transcript is None
    # The session takes 16 kHz: what it holds is what it took, at the session's rate again.
    taken = resample(pcm16.to_float(sent), rate, 16000)
    expected = np.frombuffer(pcm16.to_bytes(resample(taken, 16000, rate)), dtype="<i2").astype(np.int32)
    returned = samples(spoken.content[0].audio)
    assert returned.size == expected.size and np.max(np.abs(returned - expected)) <= SAME_PCM16

    assert (said.id, said.role, [p.type for p in said.content]) == (
        answer.id,
        "assistant",
        ["output_audio" if api == "ga" else "audio"],
    )
    assert said.content[0].transcript == answer.content[0].transcript
    heard = np.concatenate(
        [samples(e.delta) for e in events.of_type("response.output_audio.delta") if e.response_id == done.response.id]
    )
    stored = samples(said.content[0].audio)  # all of it was heard (24 kHz, the output format)
    assert stored.size == heard.size and np.max(np.abs(stored - heard)) <= SAME_PCM16


@pytest.fixture(params=["sqlite", "postgresql"])
async def served(request, demo_server):
    """(test client, pipeline, `openai` client) of the server on each backend."""
    storage_url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else ""
    async with demo_server(storage_url=storage_url) as (http, pipeline):
        client = client_of(http)
        try:
            yield http, pipeline, client
        finally:
            await client.close()


async def test_delete_takes_items_out_of_the_prompt_and_the_stored_conversation(served):
    http, _, client = served
    forgotten = "Remember the secret word: pineapple. " * 8
    async with connect(client, "ga") as conn:
        events = await open_session(conn, turn_detection=None, text_only=True)
        await conn.conversation.item.create(item=user_text(forgotten, "item_forgotten"))
        await conn.conversation.item.create(item=assistant_text("OK."))
        await conn.conversation.item.create(item=user_text("And then?", "item_then"))
        await conn.response.create(response={"max_output_tokens": 1})
        first = await events.wait_for("response.done")
        assert first.response.status in ("completed", "incomplete"), first.response.status_details
        conversation_id, answer = first.response.conversation_id, first.response.output[0].id

        await conn.send({"type": "conversation.item.delete", "item_id": "item_forgotten", "event_id": "ev_del"})
        await conn.send({"type": "conversation.item.delete", "item_id": answer})
        deleted = await events.wait_for("conversation.item.deleted", count=2)
        assert [e.item_id for e in events.of_type("conversation.item.deleted")] == ["item_forgotten", answer]
        await conn.send({"type": "conversation.item.retrieve", "item_id": "item_forgotten", "event_id": "ev_gone"})
        await refused(events, 1, "item_not_found", "ev_gone")
        await conn.send({"type": "conversation.item.delete", "item_id": "item_forgotten", "event_id": "ev_again"})
        await refused(events, 2, "item_not_found", "ev_again")
        await conn.conversation.item.create(item=user_text("One more.", "item_more"))
        added = await events.until(
            lambda: [e for e in events.of_type("conversation.item.added") if e.item.id == "item_more"]
        )
        assert added[0].previous_item_id == "item_then"  # the chain's end without the deleted answer
        await conn.response.create(response={"max_output_tokens": 1})
        second = await events.wait_for("response.done", count=2)
        assert second.response.status in ("completed", "incomplete"), second.response.status_details
        assert [t[:2] for t in await turns(http, conversation_id)] == [
            (1, "assistant"),
            (2, "user"),
            (4, "user"),
            (5, "assistant"),
        ]
        assert all("pineapple" not in text for _, _, text in await turns(http, conversation_id))

        # The same conversation as it never had them: the same prompt.
        await conn.send({"type": "conversation.select", "conversation_id": None})
        await events.wait_for("session.updated", count=2)
        await conn.conversation.item.create(item=assistant_text("OK."))
        await conn.conversation.item.create(item=user_text("And then?"))
        await conn.conversation.item.create(item=user_text("One more."))
        await conn.response.create(response={"max_output_tokens": 1})
        control = await events.wait_for("response.done", count=3)
        assert control.response.status in ("completed", "incomplete"), control.response.status_details
        usage = first.response.usage.input_tokens, second.response.usage.input_tokens
        assert usage[0] > usage[1] == control.response.usage.input_tokens
        await conn.send({"type": "conversation.item.delete", "item_id": "item_then", "event_id": "ev_left"})
        await refused(events, 3, "item_not_found", "ev_left")  # an item of the conversation left
    assert deleted.item_id == answer


async def test_an_answer_in_progress_is_stored_whole_and_kept_with_its_item_until_it_ends(demo_server):
    """While an answer plays (stored as it plays), deleting an earlier item leaves it whole at its
    index; the answer itself and the item it answers are refused deletion until it ends."""
    async with demo_server() as (http, pipeline):
        pipeline.answers_to_limit = True  # an answer still playing when the deletes come
        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn, turn_detection=None)
                await conn.conversation.item.create(item=user_text("Hello.", "item_hello"))
                await conn.conversation.item.create(item=assistant_text("Hi."))
                await conn.conversation.item.create(item=user_text("Tell me a story.", "item_story"))
                await conn.response.create()
                created = await events.wait_for("response.created")
                answer = (await events.wait_for("response.output_item.added")).item.id
                conversation_id = created.response.conversation_id

                async def stored_as_it_plays():  # (the store, polled: the answer is inserted at its first audio)
                    return len(await turns(http, conversation_id)) == 4 or events.of_type("response.done")

                await eventually(stored_as_it_plays, "the answer stored as it plays")
                assert not events.of_type("response.done"), "the answer ended before the deletes"
                await conn.send({"type": "conversation.item.delete", "item_id": answer, "event_id": "ev_answer"})
                await conn.send({"type": "conversation.item.delete", "item_id": "item_story", "event_id": "ev_story"})
                await conn.send({"type": "conversation.item.retrieve", "item_id": answer})
                await conn.send({"type": "conversation.item.delete", "item_id": "item_hello"})
                busy = "conversation_already_has_active_response"
                assert "in progress" in await refused(events, 1, busy, "ev_answer")
                assert "being answered" in await refused(events, 2, busy, "ev_story")
                retrieved = (await events.wait_for("conversation.item.retrieved")).item
                assert (retrieved.id, retrieved.status) == (answer, "in_progress")
                assert (await events.wait_for("conversation.item.deleted")).item_id == "item_hello"
                assert not events.of_type("response.done")  # all of it while the answer played

                await conn.response.cancel()
                done = await events.wait_for("response.done")
                assert done.response.status == "cancelled", done.response.status_details
                # Read back in progress: what it had so far, a prefix of all it generated.
                (part,) = retrieved.content
                assert part.type == "output_audio" and done.response.output[0].content[0].transcript.startswith(
                    part.transcript
                )
                generated = b"".join(
                    base64.b64decode(e.delta)
                    for e in events.of_type("response.output_audio.delta")
                    if e.response_id == done.response.id
                )
                so_far = base64.b64decode(part.audio)
                assert 0 < len(so_far) <= len(generated) and generated.startswith(so_far)
                stored = await (await http.get(f"/api/conversations/{conversation_id}")).json()
                said = stored["turns"][-1]
                assert [t["index"] for t in stored["turns"]] == [1, 2, 3]
                assert (said["role"], said["has_audio"], said["interrupted"]) == ("assistant", True, True)
                assert done.response.output[0].content[0].transcript.startswith(said["text"])  # what was heard
                await conn.send({"type": "conversation.item.delete", "item_id": answer})
                await conn.send({"type": "conversation.item.delete", "item_id": "item_story"})
                await events.wait_for("conversation.item.deleted", count=3)
                assert await turns(http, conversation_id) == [(1, "assistant", "Hi.")]
        finally:
            await client.close()


async def test_a_cancelled_answer_and_its_item_are_deleted_without_waiting_for_it(demo_server):
    """response.cancel makes the answer and the item it answers deletable at once: deletes sent
    right after it wait for the answer to end instead of being refused; a retrieve sent right
    after it reads the answer back as it is kept."""
    async with demo_server() as (http, pipeline):
        pipeline.answers_to_limit = True  # an answer still playing when the cancel comes
        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn, turn_detection=None)
                await conn.conversation.item.create(item=assistant_text("Hi."))
                await conn.conversation.item.create(item=user_text("Tell me a story.", "item_story"))
                await conn.response.create()
                conversation_id = (await events.wait_for("response.created")).response.conversation_id
                answer = (await events.wait_for("response.output_item.added")).item.id
                await events.wait_for("response.output_audio.delta")
                await conn.response.cancel()
                await conn.send({"type": "conversation.item.retrieve", "item_id": answer})  # (as agents SDKs do)
                await conn.send({"type": "conversation.item.delete", "item_id": answer})
                await conn.send({"type": "conversation.item.delete", "item_id": "item_story"})
                await events.wait_for("conversation.item.deleted", count=2)
                assert [e.item_id for e in events.of_type("conversation.item.deleted")] == [answer, "item_story"]
                done = (await events.wait_for("response.done")).response
                assert done.status == "cancelled"
                assert not events.of_type("error"), events.of_type("error")
                assert await turns(http, conversation_id) == [(0, "assistant", "Hi.")]
                # The retrieve waited for the cut answer to be stored: it reads back as kept.
                read_back = await events.wait_for("conversation.item.retrieved")
                kept = read_back.item
                assert (kept.id, kept.status) == (answer, "incomplete")
                assert events.position(read_back) < events.position(events.of_type("conversation.item.deleted")[0])
                if kept.content:  # (some of it was heard: its transcript, as response.done's output says)
                    assert kept.content[0].transcript == done.output[0].content[0].transcript
        finally:
            await client.close()


async def test_a_truncate_after_a_delete_of_its_item_is_taken_after_it(demo_server):
    """A truncate is answered at once, except after a delete of its item the client sent first:
    queued behind an item that waits for the answer playing, the delete comes first anyway."""
    async with demo_server() as (http, pipeline):
        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn, turn_detection=None)
                await conn.conversation.item.create(item=user_text("Hello."))
                await conn.response.create()
                first = (await events.wait_for("response.done")).response
                assert first.output[0].content[0].type == "output_audio"  # (so a truncate would cut it)
                pipeline.answers_to_limit = True  # the next answer still playing when the edits come
                await answer_playing(conn, events)
                await conn.conversation.item.create(item=user_text("Waiting for the answer."))
                item = first.output[0].id
                await conn.send({"type": "conversation.item.delete", "item_id": item, "event_id": "ev_delete"})
                truncate = {"item_id": item, "content_index": 0, "audio_end_ms": 100, "event_id": "ev_truncate"}
                await conn.send({"type": "conversation.item.truncate", **truncate})
                await conn.response.cancel()
                await refused(events, 1, "item_not_found", "ev_truncate")
                deleted = await events.wait_for("conversation.item.deleted")
                assert deleted.item_id == item
                assert events.position(deleted) < events.position(events.of_type("error")[0])
                assert not events.of_type("conversation.item.truncated")
        finally:
            await client.close()


async def test_a_truncate_right_after_a_delete_of_its_item_is_answered_after_it(v1_server, openai_client):
    """With nothing queued the delete is taken at once; a truncate that comes while it runs
    still waits for it (five rounds: the truncate lands at some point of the delete)."""
    async with connect(openai_client, "ga") as conn:
        events = await open_session(conn, turn_detection=None, text_only=True)
        for attempt in range(1, 6):
            await conn.conversation.item.create(item=user_text("Hello."))
            await conn.response.create(response={"max_output_tokens": 2})
            answer = (await events.wait_for("response.done", count=attempt)).response.output[0].id
            await conn.send({"type": "conversation.item.delete", "item_id": answer})
            truncate = {"item_id": answer, "content_index": 0, "audio_end_ms": 0, "event_id": f"ev_{attempt}"}
            await conn.send({"type": "conversation.item.truncate", **truncate})
            error = await events.wait_for("error", count=attempt)
            assert (error.error.code, error.error.event_id) == ("item_not_found", f"ev_{attempt}"), error
            deleted = events.of_type("conversation.item.deleted")
            assert len(deleted) == attempt and events.position(deleted[-1]) < events.position(error)


async def test_a_truncate_of_the_answer_playing_cuts_it_at_once_whatever_waits(demo_server):
    async with demo_server() as (http, pipeline):
        pipeline.answers_to_limit = True  # still playing when the edits come
        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn, turn_detection=None)
                _, item = await answer_playing(conn, events)
                await conn.conversation.item.create(item=user_text("Waiting for the answer."))
                await conn.send({"type": "conversation.item.retrieve", "item_id": item})
                await conn.conversation.item.truncate(item_id=item, content_index=0, audio_end_ms=100)
                done = (await events.wait_for("response.done")).response
                retrieved = await events.wait_for("conversation.item.retrieved")
                assert done.status == "cancelled", done.status_details
                truncated = events.of_type("conversation.item.truncated")[0]
                assert events.position(truncated) < events.position(retrieved)
        finally:
            await client.close()


async def test_an_items_audio_before_its_text_is_prompted_first(v1_server, speech, openai_client):
    """An item [input_audio, input_text] makes the prompt of two items, its audio then its text:
    asked second, that prompt is served from the prefix cache whole but its last block, which
    the text first (the other order) would not be."""
    audio = pcm16.to_bytes(resample(speech[0], 16000, 24000))
    question = "Which language is this?"
    async with connect(openai_client, "ga") as conn:
        events = await open_session(conn, turn_detection=None, text_only=True)
        await conn.conversation.item.create(item=spoken_then_written(audio, question))
        await conn.response.create(response={"max_output_tokens": 1})
        first = await events.wait_for("response.done")
        assert first.response.status in ("completed", "incomplete"), first.response.status_details

        await conn.send({"type": "conversation.select", "conversation_id": None})
        await events.wait_for("session.updated", count=2)
        spoken = {"type": "input_audio", "audio": base64.b64encode(audio).decode()}
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [spoken]})
        await conn.conversation.item.create(item=user_text(question))
        await conn.response.create(response={"max_output_tokens": 1})
        second = await events.wait_for("response.done", count=2)
        assert second.response.status in ("completed", "incomplete"), second.response.status_details
    usage = second.response.usage
    assert usage.input_tokens == first.response.usage.input_tokens
    block_size = Config().engine.block_size  # (the served one: SERVE_CONFIG leaves it) the cache holds whole blocks
    assert usage.input_token_details.cached_tokens >= usage.input_tokens - block_size, usage
