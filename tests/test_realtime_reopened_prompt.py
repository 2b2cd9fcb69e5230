"""A conversation reopened by a later session (a client reconnecting, conversation.select) is
prompted as the session that heard it prompted it, with the official `openai` client against
the server app on the demo checkpoint: its spoken history comes back from the store sample for
sample, so the prefix cache serves the history the first session computed (usage's
cached_tokens) instead of the pipeline encoding and prefilling all of it again."""

import pytest

from kimiaudio.config import Config
from kimiaudio.server.context import SERVER_CONTEXT

from helpers.realtime_sessions import client_of, connect, open_session, user_audio, user_text
from helpers.waiting import eventually

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow


async def test_a_reopened_conversation_is_served_from_the_prefix_cache(demo_server, speech_16k):
    async with demo_server() as (http, pipeline):
        client = client_of(http)
        sessions = http.app[SERVER_CONTEXT].sessions
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn, turn_detection=None, text_only=True)
                (first_session,) = sessions.live()
                await conn.conversation.item.create(item=user_audio(speech_16k))
                await conn.response.create(response={"max_output_tokens": 1})
                first = await events.wait_for("response.done")
            assert first.response.status in ("completed", "incomplete"), first.response.status_details

            async def hung_up():
                return first_session.closed

            await eventually(hung_up, "the first session's hang-up seen")
            await first_session.close()  # returns once that close has ended: the conversation is free

            async with connect(client, "ga") as conn:
                events = await open_session(conn, turn_detection=None, text_only=True)
                await conn.send({"type": "conversation.select", "conversation_id": first.response.conversation_id})
                await events.wait_for("session.updated", count=2)
                await conn.conversation.item.create(item=user_text("And then?"))
                await conn.response.create(response={"max_output_tokens": 1})
                second = await events.wait_for("response.done")
            assert second.response.status in ("completed", "incomplete"), second.response.status_details
        finally:
            await client.close()
    # The first prompt (the spoken item) is the second's history: all of it cached but the
    # block it ends in (the cache holds whole blocks).
    heard = first.response.usage.input_tokens
    assert heard > Config().engine.block_size, first.response.usage  # (speech: more than one block)
    cached = second.response.usage.input_token_details.cached_tokens
    assert cached >= heard - Config().engine.block_size, (cached, heard)
