"""Items with nothing in them, with the official `openai` client against a real server on the
demo checkpoint (every event checked against the SDK's models of the connection's shape):

- a user or system item whose text parts are all empty, with no audio, is refused at
  conversation.item.create (an `error` naming its event and `item.content`), as an item of no
  parts is: it is no turn a response could answer, so it never enters the conversation and the
  response.create after it answers the user's turn before it;
- an assistant item of empty text (a replayed answer cut before any of it was said) is taken.
The order of events proves each absence: the session takes items and responses from one queue."""

import pytest

from helpers.realtime_sessions import APIS, client_of, connect, open_session, user_text

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("api", APIS)
async def test_an_item_of_empty_text_is_refused_at_create(demo_server, api):
    empty_user = user_text("", "item_empty")
    empty_system = {"type": "message", "role": "system", "content": [{"type": "input_text", "text": ""}]}
    empty_answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": ""}]}
    async with demo_server() as (http, pipeline):
        client = client_of(http)
        try:
            async with connect(client, api) as conn:
                events = await open_session(conn, api, turn_detection=None, text_only=True)
                await conn.conversation.item.create(item=user_text("What time is it?", "item_asked"))
                await conn.send({"type": "conversation.item.create", "item": empty_user, "event_id": "ev_user"})
                await conn.send({"type": "conversation.item.create", "item": empty_system, "event_id": "ev_system"})
                await conn.conversation.item.create(item=empty_answer | {"id": "item_said"})
                await conn.conversation.item.create(item=user_text("Thanks.", "item_thanks"))
                await conn.response.create(response={"max_output_tokens": 1})
                done = await events.wait_for("response.done")
        finally:
            await client.close()
    errors = [(e.error.code, e.error.param, e.error.event_id) for e in events.of_type("error")]
    assert errors == [("invalid_value", "item.content", "ev_user"), ("invalid_value", "item.content", "ev_system")]
    added = [e.item.id for e in events.of_type("conversation.item.added")]
    assert added[:3] == ["item_asked", "item_said", "item_thanks"] and len(added) == 4, added
    assert done.response.status in ("completed", "incomplete"), done.response.status_details
    [request] = pipeline.requests
    assert [(t.role, t.text) for t in request.history] == [("user", "What time is it?"), ("assistant", "")]
    assert request.user_text == "Thanks."
