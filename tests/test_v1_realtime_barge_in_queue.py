"""Barge-in and what waits in a session's queue, with the official `openai` client against the
real server on the demo checkpoint: a response.create queued before the user began to speak
(behind an item still being stored) is cut by that speech as it starts, as OpenAI's, started at
once, would be cut in progress (interrupt_response), instead of playing over the user."""

import asyncio
import threading

import pytest

from kimiaudio.server.context import SERVER_CONTEXT

from helpers.realtime_events import say
from helpers.realtime_sessions import client_of, connect, open_session, user_audio

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow


async def test_a_response_queued_before_a_barge_in_is_cut_as_it_starts(demo_server, speech):
    async with demo_server() as (http, _):
        store = http.app[SERVER_CONTEXT].store
        entered, let_go = threading.Event(), threading.Event()

        def hold(db):  # the store's writer thread, held: the item below is stored once it is let go
            entered.set()
            let_go.wait(300)

        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn)
                writer = asyncio.ensure_future(store.write(hold))
                try:
                    await asyncio.to_thread(entered.wait, 300)
                    await conn.conversation.item.create(item=user_audio(speech[0]))
                    await conn.response.create()
                    await say(conn, speech[1])  # (no silence after it: the user is still speaking)
                    await events.wait_for("input_audio_buffer.speech_started")
                finally:
                    let_go.set()
                    await writer
                response_id = (await events.wait_for("response.created")).response.id
                done = (await events.until(lambda: events.done(response_id))).response
        finally:
            await client.close()
    reason = done.status_details.reason if done.status_details else None
    assert (done.status, reason) == ("cancelled", "turn_detected")
    assert events.audio_seconds(response_id) == 0  # none of it played over the user
