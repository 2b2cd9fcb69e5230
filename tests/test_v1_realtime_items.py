"""Items and the response in progress, with the official `openai` client against a real `serve`
on the demo checkpoint (GA shape, every event checked against the SDK's models):

- an item created while a response plays waits for it instead of cancelling it;
- speech heard while a response plays with interrupt_response false is the next turn, answered
  after it;
- errors about a client event name its event_id, however late they come (a queued
  response.create, a commit of silence, an item placed where items cannot go);
- items go at the end of the conversation: previous_item_id naming anything else is refused,
  as is an id already taken;
- conversation.item.truncate is checked against the item's audio, and names only items of the
  conversation the session is in;
- an audio item is no commit of the input buffer, and a switch of turn detection empties it;
- appends are one byte stream: one ending inside a sample leaves its byte for the next, and a
  clear drops it;
- a system item is a system item to the client (echoed, retrieved, listed), and the model,
  which has no system role, is prompted with it as a user's text, in this session and in the
  next one that continues the conversation;
- an assistant's audio item, replayed by a client, is its transcript to the model;
- a conversation longer than the context loses its oldest turns (truncation "auto"), more of
  them at once under a retention ratio, none under "disabled" (it is refused);
- an item's text parts reach the model with its audio;
- a silence after an answer that lasts turn detection's idle_timeout_ms is committed and
  answered (input_audio_buffer.timeout_triggered), measured on the input audio's clock from
  the answer's end, not before any answer.
The order of events proves each absence: the session takes items and responses from one queue."""

import base64

import numpy as np
import pytest

from kimiaudio.audio import pcm16
from kimiaudio.audio.resampling import resample

from helpers.audio import silence
from helpers.realtime_events import Events, conversation, say
from helpers.realtime_sessions import (
    answer_playing,
    client_of,
    connect,
    open_session,
    session_update,
    user_audio,
    user_text,
)

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow


def added(events: Events, item_id: str):
    """The conversation.item.added of item_id, or None."""
    return next((e for e in events.of_type("conversation.item.added") if e.item.id == item_id), None)


async def test_an_item_created_while_a_response_plays_waits_for_it(v1_server, openai_client):
    async with connect(openai_client, "ga") as conn:
        events = await open_session(conn, turn_detection=None)
        await conn.conversation.item.create(item=user_text("Tell me a story."))
        await conn.response.create()
        await events.wait_for("response.output_audio.delta")  # it plays until its audio has been heard
        await conn.conversation.item.create(item=user_text("And then?", "item_and_then"))
        first = await events.wait_for("response.done")
        assert first.response.status in ("completed", "incomplete"), first.response.status_details
        later = await events.until(lambda: added(events, "item_and_then"))
        assert events.position(later) > events.position(first)
        assert later.previous_item_id == first.response.output[0].id
        await conn.response.create()  # it answers the new item
        second = await events.wait_for("response.done", count=2)
        assert second.response.status in ("completed", "incomplete"), second.response.status_details
        assert not events.of_type("error"), [e.error for e in events.of_type("error")]


async def test_speech_without_interrupt_response_is_the_next_turn(v1_server, speech, openai_client):
    async with connect(openai_client, "ga") as conn:
        detection = {"type": "server_vad", "interrupt_response": False}
        events = await open_session(conn, turn_detection=detection)
        await say(conn, np.concatenate([speech[0], silence(1.0)]))
        await events.wait_for("response.output_audio.delta")
        await say(conn, np.concatenate([speech[1], silence(1.0)]))  # over the answer
        first = await events.wait_for("response.done")
        assert first.response.status in ("completed", "incomplete"), first.response.status_details
        committed = await events.wait_for("input_audio_buffer.committed", count=2)
        assert committed.previous_item_id == first.response.output[0].id
        second = await events.wait_for("response.done", count=2)
        assert second.response.status in ("completed", "incomplete"), second.response.status_details
        assert len(events.of_type("input_audio_buffer.speech_started")) == 2


async def test_errors_name_their_event_and_items_go_at_the_end(v1_server, openai_client):
    async with connect(openai_client, "ga") as conn:
        events = await open_session(conn, turn_detection=None, text_only=True)

        async def refused(count: int, code: str, event_id: str, param: str | None = None):
            error = (await events.wait_for("error", count=count)).error
            assert (error.code, error.event_id) == (code, event_id), error
            assert param is None or error.param == param, error

        await conn.send({"type": "input_audio_buffer.clear", "event_id": 123})
        error = (await events.wait_for("error")).error
        assert error.code == "invalid_value" and error.param == "event_id", error

        create = {"type": "conversation.item.create", "item": user_text("Hi.", "item_a")}
        await conn.send(create | {"previous_item_id": "item_nope", "event_id": "ev_unknown"})
        await refused(2, "item_not_found", "ev_unknown", "previous_item_id")
        await conn.send(create | {"event_id": "ev_a"})
        first = await events.until(lambda: added(events, "item_a"))
        await conn.send(create | {"event_id": "ev_again"})
        await refused(3, "invalid_value", "ev_again", "item.id")
        first_of_all = {"item": user_text("First?", "item_b"), "previous_item_id": "root", "event_id": "ev_r"}
        await conn.send(create | first_of_all)
        await refused(4, "unsupported", "ev_r", "previous_item_id")
        await conn.send(create | {"item": user_text("Hello.", "item_c"), "previous_item_id": "item_a"})
        third = await events.until(lambda: added(events, "item_c"))
        assert third.previous_item_id == "item_a" and first.previous_item_id is None
        assert added(events, "item_b") is None and len(events.of_type("conversation.item.added")) == 2

        await conn.send({"type": "response.create", "response": {"max_output_tokens": 8}, "event_id": "ev_1"})
        await conn.send({"type": "response.create", "event_id": "ev_2"})  # while the first runs
        await refused(5, "conversation_already_has_active_response", "ev_2")
        done = await events.wait_for("response.done")
        assert done.response.status in ("completed", "incomplete"), done.response.status_details

        answer = done.response.output[0].id  # a text answer: no audio to truncate into
        truncate = {"type": "conversation.item.truncate", "item_id": answer, "audio_end_ms": 0}
        await conn.send(truncate | {"content_index": 0, "audio_end_ms": 1})
        await refused(6, "invalid_value", None, "audio_end_ms")
        await conn.send(truncate | {"content_index": 1})
        await refused(7, "invalid_value", None, "conversation.item.truncate.content_index")

        quiet = pcm16.to_bytes(resample(silence(0.5), 16000, 24000))
        await conn.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(quiet).decode()})
        await conn.send({"type": "input_audio_buffer.commit", "event_id": "ev_quiet"})
        await refused(8, "invalid_audio", "ev_quiet")


async def test_truncate_names_items_of_the_conversation_in_use(v1_server, openai_client):
    async with connect(openai_client, "ga") as conn:
        events = await open_session(conn, turn_detection=None)
        await conn.conversation.item.create(item=user_text("Say something."))
        await conn.response.create()
        done = await events.wait_for("response.done")
        assert done.response.status in ("completed", "incomplete"), done.response.status_details
        first_id = done.response.conversation_id
        answer = done.response.output[0].id
        before = (await conversation(v1_server, first_id))["turns"]

        await conn.send({"type": "conversation.select", "conversation_id": None})
        await events.wait_for("session.updated", count=2)
        await conn.conversation.item.create(item=user_text("A new conversation.", "item_new"))
        await events.until(lambda: added(events, "item_new"))
        await conn.send({"type": "conversation.item.truncate", "item_id": answer, "audio_end_ms": 0})
        error = (await events.wait_for("error")).error
        assert error.code == "item_not_found" and error.param == "item_id", error
        assert not events.of_type("conversation.item.truncated")
        assert (await conversation(v1_server, first_id))["turns"] == before


async def test_an_item_truncated_ends_where_it_was_cut(v1_server, openai_client):
    """After a truncate the item's audio ends there: a later truncate past that point is
    refused (as OpenAI's audio "already shorter"), naming its event; one before it cuts more."""
    async with connect(openai_client, "ga") as conn:
        events = await open_session(conn, turn_detection=None)
        await conn.conversation.item.create(item=user_text("Say something."))
        await conn.response.create()
        done = await events.wait_for("response.done")
        assert done.response.status in ("completed", "incomplete"), done.response.status_details
        answer = done.response.output[0].id
        await conn.conversation.item.truncate(item_id=answer, content_index=0, audio_end_ms=400)
        await events.wait_for("conversation.item.truncated")
        past = {"item_id": answer, "content_index": 0, "audio_end_ms": 800, "event_id": "ev_past"}
        await conn.send({"type": "conversation.item.truncate", **past})
        error = (await events.wait_for("error")).error
        assert (error.code, error.param, error.event_id) == ("invalid_value", "audio_end_ms", "ev_past"), error
        assert "400 ms left by an earlier truncate" in error.message
        await conn.conversation.item.truncate(item_id=answer, content_index=0, audio_end_ms=200)
        truncated = await events.wait_for("conversation.item.truncated", count=2)
        assert truncated.audio_end_ms == 200
        assert len(events.of_type("conversation.item.truncated")) == 2
        turns = (await conversation(v1_server, done.response.conversation_id))["turns"]
    assert turns[1]["duration_s"] == pytest.approx(0.2, abs=0.01)


async def test_a_select_takes_its_place_in_the_order_of_the_items(v1_server, openai_client):
    """conversation.select is taken in the session's order: an item created just before it is
    stored in the conversation it leaves, one just after in the one it takes up."""
    async with connect(openai_client, "ga") as conn:
        events = await open_session(conn, turn_detection=None, max_output_tokens=40)
        await conn.conversation.item.create(item=user_text("First.", "item_first"))
        await conn.response.create()
        await events.wait_for("response.output_audio.delta")  # it plays: the next item waits for its end
        await conn.conversation.item.create(item=user_text("Before the switch.", "item_before"))
        await conn.send({"type": "conversation.select", "conversation_id": None})
        await conn.conversation.item.create(item=user_text("After the switch.", "item_after"))
        await events.until(lambda: added(events, "item_after"))
        old_id, new_id = [e.conversation.id for e in events.of_type("conversation.created")]
    said = [t["text"] for t in (await conversation(v1_server, old_id))["turns"]]
    assert said[0] == "First." and said[2:] == ["Before the switch."], said
    assert [t["text"] for t in (await conversation(v1_server, new_id))["turns"]] == ["After the switch."]


async def test_a_select_cuts_the_answer_playing_as_the_clients_cancel(demo_server):
    """conversation.select while an answer plays cuts it, and its response.done says the client
    cancelled it (no turn was detected)."""
    async with demo_server() as (http, pipeline):
        pipeline.answers_to_limit = True  # still playing when the select comes
        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn, turn_detection=None)
                response_id, _ = await answer_playing(conn, events)
                await conn.send({"type": "conversation.select", "conversation_id": None})
                done = (await events.wait_for("response.done")).response
                await events.wait_for("session.updated", count=2)
        finally:
            await client.close()
    assert (done.id, done.status, done.status_details.reason) == (response_id, "cancelled", "client_cancelled")


async def test_an_audio_item_is_no_commit_and_a_mode_switch_empties_the_buffer(v1_server, speech, openai_client):
    async with connect(openai_client, "ga") as conn:
        events = await open_session(conn, turn_detection=None, text_only=True)
        await conn.conversation.item.create(item=user_audio(speech[0]) | {"id": "item_spoken"})
        await events.until(lambda: added(events, "item_spoken"))

        await say(conn, speech[1])  # kept for a commit that never comes
        await conn.session.update(session=session_update("ga", turn_detection={"type": "server_vad"}))
        updated = await events.wait_for("session.updated", count=2)
        cleared = events.of_type("input_audio_buffer.cleared")
        assert len(cleared) == 1 and events.position(cleared[0]) < events.position(updated)
        await conn.session.update(session=session_update("ga", turn_detection=None))
        await events.wait_for("session.updated", count=3)
        await say(conn, speech[0])
        await conn.input_audio_buffer.commit()
        await events.wait_for("input_audio_buffer.committed")
        committed = next(e for e in events.raw if e["type"] == "input_audio_buffer.committed")
        assert committed["duration_s"] == pytest.approx(speech[0].size / 16000, abs=0.05)
        assert committed["previous_item_id"] == "item_spoken"
        assert len(events.of_type("input_audio_buffer.committed")) == 1


def odd_pieces(raw: bytes) -> list[bytes]:
    """`raw` cut into pieces of odd lengths, as a client cutting a byte stream anywhere would."""
    pieces, start = [], 0
    for size in (1, 4801, 3, 999, 7):
        pieces.append(raw[start : start + size])
        start += size
    return [*pieces, raw[start:]]


async def test_appends_cut_inside_samples_join_into_the_same_audio(demo_server, speech):
    raw = pcm16.to_bytes(speech[0])  # at the session's 16 kHz: nothing is resampled
    assert len(raw) > 6000 and len(raw) % 2 == 0
    async with demo_server() as (http, pipeline):
        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn, turn_detection=None, text_only=True, input_rate=16000)
                stray = [raw[:1]]  # half a sample, cleared before the audio
                for turn, (cleared, pieces) in enumerate([([], [raw]), ([], odd_pieces(raw)), (stray, [raw])]):
                    for piece in cleared:
                        await conn.input_audio_buffer.append(audio=base64.b64encode(piece).decode())
                    if cleared:
                        await conn.input_audio_buffer.clear()
                    for piece in pieces:
                        await conn.input_audio_buffer.append(audio=base64.b64encode(piece).decode())
                    await conn.input_audio_buffer.commit()
                    await conn.response.create(response={"max_output_tokens": 1})
                    await events.wait_for("response.done", count=turn + 1)
        finally:
            await client.close()
    assert not events.of_type("error"), [e.error for e in events.of_type("error")]
    heard = [request.user_audio for request in pipeline.requests]
    assert len(heard) == 3
    assert all(np.array_equal(audio, pcm16.to_float(raw)) for audio in heard)


async def test_a_system_item_stays_a_system_item(demo_server):
    system = {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Be brief."}]}
    async with demo_server() as (http, pipeline):
        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn, turn_detection=None, text_only=True)
                await conn.conversation.item.create(item=system | {"id": "item_sys"})
                await conn.conversation.item.create(item=user_text("Hi."))
                await conn.response.create(response={"max_output_tokens": 1})
                await events.wait_for("response.done")
                await conn.send({"type": "conversation.item.retrieve", "item_id": "item_sys"})
                retrieved = (await events.wait_for("conversation.item.retrieved")).item
            added = next(e.item for e in events.of_type("conversation.item.added") if e.item.id == "item_sys")
            conversation_id = events.of_type("conversation.created")[0].conversation.id
            async with connect(client, "ga") as conn:  # the conversation continued: stored, then prompted
                events = await open_session(conn, turn_detection=None, text_only=True)
                await conn.send({"type": "conversation.select", "conversation_id": conversation_id})
                await events.wait_for("session.updated", count=2)
                await conn.conversation.item.create(item=user_text("And?"))
                await conn.response.create(response={"max_output_tokens": 1})
                await events.wait_for("response.done")
            stored = await (await http.get(f"/api/conversations/{conversation_id}")).json()
        finally:
            await client.close()
    assert (added.role, [(p.type, p.text) for p in added.content]) == ("system", [("input_text", "Be brief.")])
    assert (retrieved.role, [(p.type, p.text) for p in retrieved.content]) == ("system", [("input_text", "Be brief.")])
    assert [(t["role"], t["text"]) for t in stored["turns"]][:2] == [("system", "Be brief."), ("user", "Hi.")]
    for request in pipeline.requests:  # no system role in the model's prompt: a user's text
        assert (request.history[0].role, request.history[0].text) == ("user", "Be brief.")
    assert len(pipeline.requests) == 2


@pytest.mark.parametrize("api", ["ga", "beta"])
async def test_an_assistant_audio_item_replayed_is_its_transcript(demo_server, api):
    """A client replaying an earlier conversation sends the answers as it got them: an audio
    part with its transcript (GA output_audio, beta audio), which the model is prompted with."""
    part = "output_audio" if api == "ga" else "audio"
    said = {"type": "message", "role": "assistant", "content": [{"type": part, "transcript": "It is noon."}]}
    async with demo_server() as (http, pipeline):
        client = client_of(http)
        try:
            async with connect(client, api) as conn:
                events = await open_session(conn, api, turn_detection=None, text_only=True)
                await conn.conversation.item.create(item=user_text("What time is it?"))
                await conn.conversation.item.create(item=said)
                await conn.conversation.item.create(item=user_text("Thanks."))
                await conn.send({"type": "conversation.item.create", "item": said | {"content": [{"type": part}]}})
                missing = await events.wait_for("error")
                await conn.response.create(response={"max_output_tokens": 1})
                await events.wait_for("response.done")
        finally:
            await client.close()
    assert missing.error.param == "item.content[0].transcript", missing
    [request] = pipeline.requests
    assert [(t.role, t.text) for t in request.history] == [("user", "What time is it?"), ("assistant", "It is noon.")]
    assert request.user_text == "Thanks."


async def test_a_conversation_longer_than_the_context_loses_its_oldest_turns(v1_server, openai_client):
    async with connect(openai_client, "ga") as conn:
        events = await open_session(conn, turn_detection=None, text_only=True, instructions="Be brief.")
        long_text = "hello world " * 5000  # past engine.max_model_len alone
        await conn.conversation.item.create(item=user_text(long_text, "item_long"))
        await conn.conversation.item.create(
            item={"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "OK."}]}
        )
        await conn.conversation.item.create(item=user_text("And now?"))
        await conn.response.create(response={"max_output_tokens": 8})
        done = await events.wait_for("response.done")
        assert done.response.status in ("completed", "incomplete"), done.response.status_details
        assert done.response.usage.input_tokens < 1000  # the long turn left out, the rest kept

        await conn.conversation.item.create(item=user_text(long_text))  # the turn itself too long
        await conn.response.create(response={"max_output_tokens": 8})
        failed = await events.wait_for("response.done", count=2)
        assert failed.response.status == "failed"
        assert failed.response.status_details.error.code == "context_length_exceeded"


async def test_truncation_as_the_session_sets_it(v1_server, openai_client):
    async with connect(openai_client, "ga") as conn:
        events = await open_session(conn, turn_detection=None, text_only=True)
        assert events.of_type("session.updated")[-1].session.truncation == "auto"
        for index in range(3):
            await conn.conversation.item.create(item=user_text("hello world " * 30, f"item_{index}"))
            await conn.response.create(response={"max_output_tokens": 2})
            await events.wait_for("response.done", count=index + 1)
        await conn.conversation.item.create(item=user_text("And now?"))
        await conn.response.create(response={"max_output_tokens": 2})
        whole = (await events.wait_for("response.done", count=4)).response.usage.input_tokens
        assert whole > 150  # three turns of 60 words: nothing was left out

        ratio = {"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 150}}
        await conn.session.update(session={"type": "realtime", "truncation": ratio})
        truncation = (await events.wait_for("session.updated", count=2)).session.truncation
        assert (truncation.type, truncation.retention_ratio, truncation.token_limits.post_instructions) == (
            "retention_ratio",
            0.5,
            150,
        )
        await conn.conversation.item.create(item=user_text("And then?"))
        await conn.response.create(response={"max_output_tokens": 2})
        done = await events.wait_for("response.done", count=5)
        assert done.response.status in ("completed", "incomplete"), done.response.status_details
        assert done.response.usage.input_tokens <= 75 + 10  # half of the limit, and the prompt's own markers

        await conn.session.update(session={"type": "realtime", "truncation": "disabled"})
        assert (await events.wait_for("session.updated", count=3)).session.truncation == "disabled"
        await conn.conversation.item.create(item=user_text("hello world " * 5000))  # past engine.max_model_len
        await conn.conversation.item.create(item=user_text("Short."))
        await conn.response.create(response={"max_output_tokens": 2})
        failed = await events.wait_for("response.done", count=6)
        assert failed.response.status == "failed"
        assert failed.response.status_details.error.code == "context_length_exceeded"

        for event_id, value, param in (
            ("ev_t1", "sometimes", "session.truncation"),
            ("ev_t2", {"type": "retention_ratio", "retention_ratio": 1.5}, "session.truncation.retention_ratio"),
            ("ev_t3", {"type": "retention_ratio"}, "session.truncation.retention_ratio"),
            (
                "ev_t4",
                {"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 0}},
                "session.truncation.token_limits.post_instructions",
            ),
        ):
            await conn.send({"type": "session.update", "session": {"truncation": value}, "event_id": event_id})
            error = (await events.wait_for("error", count=int(event_id[-1]))).error
            assert (error.param, error.event_id) == (param, event_id), error


async def test_an_answer_cut_by_its_limit_is_incomplete_and_metadata_is_echoed(v1_server, openai_client):
    async with connect(openai_client, "ga") as conn:
        events = await open_session(conn, turn_detection=None, text_only=True)
        await conn.conversation.item.create(item=user_text("Tell me everything."))
        tag = {"purpose": "summary"}
        await conn.response.create(response={"max_output_tokens": 3, "metadata": tag})
        created = await events.wait_for("response.created")
        done = await events.wait_for("response.done")
        assert created.response.metadata == tag and done.response.metadata == tag
        assert done.response.usage.output_tokens <= 3
        if done.response.usage.output_tokens == 3:  # (a model may end sooner: then it is complete)
            assert done.response.status == "incomplete", done.response.status_details
            assert done.response.status_details.reason == "max_output_tokens"
            assert done.response.output[0].status == "incomplete"
        else:
            assert done.response.status == "completed", done.response.status_details

        many = {f"k{i}": "v" for i in range(17)}
        await conn.send({"type": "response.create", "response": {"metadata": many}, "event_id": "ev_meta"})
        error = (await events.wait_for("error")).error
        assert (error.code, error.param, error.event_id) == ("invalid_value", "response.metadata", "ev_meta")


async def test_a_silence_after_an_answer_times_out_into_a_response(v1_server, openai_client):
    async with connect(openai_client, "ga") as conn:
        events = await open_session(
            conn, turn_detection={"type": "server_vad", "idle_timeout_ms": 2000}, text_only=True
        )
        assert events.of_type("session.updated")[-1].session.audio.input.turn_detection.idle_timeout_ms == 2000
        await say(conn, silence(3.0))  # before any answer: no timeout
        await conn.conversation.item.create(item=user_text("Hello."))
        await conn.response.create(response={"max_output_tokens": 2})
        await events.wait_for("response.done")
        await say(conn, silence(2.5))
        triggered = await events.wait_for("input_audio_buffer.timeout_triggered")
        assert (
            triggered.audio_start_ms > 2900
        )  # from the answer's end: after the 3 s before it (less the resampler's delay)
        assert 2000 <= triggered.audio_end_ms - triggered.audio_start_ms < 2100  # (the audio comes in 100 ms)
        committed = await events.wait_for("input_audio_buffer.committed")
        assert committed.item_id == triggered.item_id
        answer = (await events.wait_for("response.done", count=2)).response
        assert answer.status in ("completed", "incomplete"), answer.status_details
        assert events.position(committed) < events.position(events.of_type("response.created")[-1])
        assert len(events.of_type("input_audio_buffer.timeout_triggered")) == 1

        # An answer between two pieces of audio starts the silence again, though no audio came meanwhile.
        await say(conn, silence(1.5))
        await conn.conversation.item.create(item=user_text("Another."))
        await conn.response.create(response={"max_output_tokens": 2})
        await events.wait_for("response.done", count=3)
        await say(conn, silence(2.5))
        again = await events.wait_for("input_audio_buffer.timeout_triggered", count=2)
        assert again.audio_start_ms > triggered.audio_end_ms + 1400  # after the 1.5 s before the answer

        for event_id, detection, param in (
            ("ev_i1", {"type": "server_vad", "idle_timeout_ms": 500}, "idle_timeout_ms"),
            ("ev_i2", {"type": "semantic_vad", "idle_timeout_ms": 5000}, "idle_timeout_ms"),
        ):
            update = session_update("ga", turn_detection=detection)
            await conn.send({"type": "session.update", "session": update, "event_id": event_id})
            error = (await events.wait_for("error", count=int(event_id[-1]))).error
            assert (error.event_id, error.param) == (event_id, f"session.audio.input.turn_detection.{param}"), error


async def test_speech_that_begins_as_the_silence_times_out_is_heard_not_timed_out(v1_server, speech, openai_client):
    """Speech that begins just before the idle timeout (the VAD reports speech_started only after
    min_speech_ms of it) holds the timeout: the utterance is the user's turn, not a timeout."""
    async with connect(openai_client, "ga") as conn:
        events = await open_session(
            conn, turn_detection={"type": "server_vad", "idle_timeout_ms": 2000}, text_only=True
        )
        await conn.conversation.item.create(item=user_text("Hello."))
        await conn.response.create(response={"max_output_tokens": 2})
        await events.wait_for("response.done")
        await say(conn, np.concatenate([silence(1.85), speech[0], silence(1.0)]))
        started = await events.wait_for("input_audio_buffer.speech_started")
        committed = await events.wait_for("input_audio_buffer.committed")
        await events.wait_for("response.done", count=2)  # (the utterance is answered)
        assert committed.item_id == started.item_id and 1800 <= started.audio_start_ms < 2000
        assert not events.of_type("input_audio_buffer.timeout_triggered")


async def test_semantic_vad_is_reported_as_asked(v1_server, openai_client):
    async with connect(openai_client, "ga") as conn:
        events = await open_session(conn, turn_detection={"type": "semantic_vad", "eagerness": "low"})
        detection = events.of_type("session.updated")[-1].session.audio.input.turn_detection
        assert (detection.type, detection.eagerness, detection.interrupt_response) == ("semantic_vad", "low", True)


async def test_an_items_text_reaches_the_model_with_its_audio(v1_server, speech, openai_client):
    """A user item of text and audio is prompted as its text, then its speech: as the turn
    answered and as history. The prompt's length (usage.input_tokens) grows by the same text
    message in both places."""
    audio = base64.b64encode(pcm16.to_bytes(resample(speech[0], 16000, 24000))).decode()
    text = {"type": "input_text", "text": "Answer in one word, please."}

    async def prompt_length(with_text: bool, as_history: bool) -> int:
        content = ([text] if with_text else []) + [{"type": "input_audio", "audio": audio}]
        async with connect(openai_client, "ga") as conn:
            events = await open_session(conn, turn_detection=None, text_only=True)
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": content})
            if as_history:
                assistant = {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "OK."}],
                }
                await conn.conversation.item.create(item=assistant)
                await conn.conversation.item.create(item=user_text("And then?"))
            await conn.response.create(response={"max_output_tokens": 1})
            done = await events.wait_for("response.done")
            assert done.response.status in ("completed", "incomplete"), done.response.status_details
            return done.response.usage.input_tokens

    answered = await prompt_length(True, False) - await prompt_length(False, False)
    in_history = await prompt_length(True, True) - await prompt_length(False, True)
    assert answered == in_history > 0
