"""Barge-in and what waits in a session's queue, with the official `openai` client against the
real server on the demo checkpoint: a response.create queued before the user began to speak
(behind an item still being stored) is cut by that speech as it starts, as OpenAI's, started at
once, would be cut in progress (interrupt_response), instead of playing over the user; so is
the server VAD's own response to an utterance, when the user speaks up again while it starts
(behind the answer the utterance cut, still being stored)."""

import asyncio
import threading

import numpy as np
import pytest

from kimiaudio.server.context import SERVER_CONTEXT
from kimiaudio.server.session.conversation import Conversation

from helpers.audio import silence
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


async def test_the_vad_response_starting_when_the_user_speaks_again_is_cut(demo_server, speech, monkeypatch):
    storing, release = asyncio.Event(), asyncio.Event()
    update_assistant = Conversation.update_assistant

    async def held(self, *args, **kwargs):  # the final record of the answer cut by the barge-in, held back
        storing.set()
        await release.wait()
        return await update_assistant(self, *args, **kwargs)

    monkeypatch.setattr(Conversation, "update_assistant", held)
    async with demo_server() as (http, pipeline):
        pipeline.answers_to_limit = True  # (each answer still plays when the next speech comes)
        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn)
                await say(conn, np.concatenate([speech[0], silence(1.0)]))
                first = (await events.wait_for("response.created")).response.id
                await events.until(lambda: events.audio_seconds(first) > 0)
                await say(conn, np.concatenate([speech[1], silence(1.0)]))  # cuts the first answer
                await events.wait_for("input_audio_buffer.committed", count=2)
                await storing.wait()  # the cut answer is being stored: the second waits to start
                await say(conn, speech[0])  # (no silence after it: the user is still speaking)
                await events.wait_for("input_audio_buffer.speech_started", count=3)
                release.set()
                second = (await events.wait_for("response.created", count=2)).response.id
                done = (await events.until(lambda: events.done(second))).response
        finally:
            release.set()
            await client.close()
    reason = done.status_details.reason if done.status_details else None
    assert (done.status, reason) == ("cancelled", "turn_detected")
    assert events.audio_seconds(second) == 0  # none of it played over the user
