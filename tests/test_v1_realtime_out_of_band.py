"""Out-of-band responses (response.create with conversation "none") with the official `openai`
client against a real `serve` on the demo checkpoint (GA shape, every event checked against
the SDK's models):

- an out-of-band response answers in text about the conversation as it stands, names no
  conversation, adds no item to it and stores nothing;
- with `input`, its context is its own items (references to the conversation's items and
  new messages), not the whole conversation;
- what it cannot do is refused naming the field (a conversation other than auto or none,
  `input` for the conversation's own response, audio out), as is an input item it cannot take
  (a reference to an item that is not in the conversation, silent audio): no response starts;
- it runs while the conversation's answer plays (it does not wait for it), and a
  response.cancel naming it cancels it alone."""

import pytest

from helpers.realtime_events import conversation
from helpers.realtime_sessions import answer_playing, client_of, connect, open_session, user_text

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow


async def test_an_out_of_band_response_answers_beside_the_conversation(v1_server, openai_client):
    async with connect(openai_client, "ga") as conn:
        events = await open_session(conn, turn_detection=None)
        await conn.conversation.item.create(item=user_text("Tell me about the sea.", "item_sea"))
        await conn.response.create(response={"max_output_tokens": 20})
        answer = (await events.wait_for("response.done")).response
        conversation_id = answer.conversation_id
        items_before = len(events.of_type("conversation.item.added"))

        tag = {"purpose": "summary"}
        summary = {"conversation": "none", "instructions": "Summarize.", "max_output_tokens": 8, "metadata": tag}
        await conn.response.create(response=summary)
        created = (await events.wait_for("response.created", count=2)).response
        whole = (await events.wait_for("response.done", count=2)).response
        assert created.conversation_id is None and created.output_modalities == ["text"]
        assert (whole.conversation_id, whole.metadata, whole.output_modalities) == (None, tag, ["text"])
        assert whole.status in ("completed", "incomplete"), whole.status_details
        text = "".join(e.delta for e in events.of_type("response.output_text.delta") if e.response_id == whole.id)
        assert whole.output[0].content[0].text == text
        assert len(events.of_type("conversation.item.added")) == items_before  # no item of the conversation

        own = {
            "conversation": "none",
            "instructions": "Summarize.",
            "max_output_tokens": 8,
            "input": [{"type": "item_reference", "id": "item_sea"}, user_text("And the mountains.")],
        }
        await conn.response.create(response=own)
        focused = (await events.wait_for("response.done", count=3)).response
        assert focused.status in ("completed", "incomplete"), focused.status_details
        assert 0 < focused.usage.input_tokens < whole.usage.input_tokens  # not the spoken answer's codes

        silent = {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": "AAAAAAAA"}]}
        unknown = {"type": "item_reference", "id": "x"}
        for event_id, response, param in (
            ("ev_o1", {"conversation": "other"}, "response.conversation"),
            ("ev_o2", {"input": []}, "response.input"),
            ("ev_o3", {"conversation": "none", "output_modalities": ["audio"]}, "response.output_modalities"),
            ("ev_o4", {"conversation": "none", "input": [unknown]}, "response.input[0].id"),
            ("ev_o5", {"conversation": "none", "input": [user_text("Hi."), silent]}, "response.input[1]"),
        ):
            await conn.send({"type": "response.create", "response": response, "event_id": event_id})
            error = (await events.wait_for("error", count=int(event_id[-1]))).error
            assert (error.event_id, error.param) == (event_id, param), error
        assert [e.code for e in (e.error for e in events.of_type("error"))][3:] == ["item_not_found", "invalid_audio"]
        assert len(events.of_type("response.created")) == 3  # none for the refused ones
    turns = (await conversation(v1_server, conversation_id))["turns"]
    assert [t["role"] for t in turns] == ["user", "assistant"]  # the out-of-band answers stored nowhere


async def test_it_runs_while_the_conversations_answer_plays_and_is_cancelled_by_its_id(demo_server):
    async with demo_server() as (http, pipeline):
        pipeline.answers_to_limit = True  # both answers still running when the cancels come
        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn, turn_detection=None)
                playing, _ = await answer_playing(conn, events)
                await conn.response.create(response={"conversation": "none", "instructions": "Summarize."})
                side = (await events.wait_for("response.created", count=2)).response.id
                await conn.response.cancel(response_id=side)
                done = (await events.wait_for("response.done")).response
                assert (done.id, done.status, done.status_details.reason) == (side, "cancelled", "client_cancelled")
                assert not events.done(playing), "the conversation's answer ended first"
                await conn.response.cancel()  # (no id: the conversation's own)
                ended = (await events.wait_for("response.done", count=2)).response
                assert (ended.id, ended.status) == (playing, "cancelled")
        finally:
            await client.close()
