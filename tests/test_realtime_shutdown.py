"""A Realtime session while the server stops (serve.py's drain, then app.py's on_shutdown), with
the official `openai` client against the server app on the demo checkpoint: a response.create
the session took before the stop began is answered in the grace; one that comes after gets
response.done failed `shutting_down` (its user item is kept); closing the session for the stop
says so in an `error` event, then the WebSocket closes as going away (1001). An out-of-band
response counts as answering too (the stop waits for it), and one the stop cuts still ends with
its response.done. And the session's queue: what waits in it counts as answering (the stop waits
for it), and what came once the server was stopping is taken as late."""

import asyncio

import pytest

from kimiaudio.server.context import SERVER_CONTEXT
from kimiaudio.server.serve import drain
from kimiaudio.server.session.queued_turn import QueuedSelect
from kimiaudio.server.session.turn_queue import TurnQueue

from helpers.realtime_events import say
from helpers.realtime_sessions import client_of, connect, open_session, user_text
from helpers.waiting import eventually

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow


async def test_what_was_asked_before_the_stop_is_answered_and_what_came_after_is_refused(demo_server, speech_16k):
    async with demo_server() as (http, pipeline):
        context = http.app[SERVER_CONTEXT]
        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn, turn_detection=None, max_output_tokens=40)
                (session,) = context.sessions.live()
                await say(conn, speech_16k)
                await conn.input_audio_buffer.commit()
                await conn.response.create()

                async def asked():  # the session has them: queued, or answering already
                    return session.is_answering

                await eventually(asked, "the session answering")
                draining = asyncio.ensure_future(drain(http.app, 120.0, asyncio.Event()))
                answered = (await events.wait_for("response.done")).response
                await asyncio.wait_for(draining, 120)  # (it waited for that answer)

                await conn.conversation.item.create(item=user_text("And then?"))
                await conn.response.create()
                refused = (await events.wait_for("response.done", count=2)).response
                added = await events.wait_for("conversation.item.added", count=3)

                await context.sessions.close_all()  # (the app's on_shutdown)
                await events.task
                close_code = conn._connection.close_code  # (the SDK keeps the websockets connection here)
        finally:
            await client.close()
        assert answered.status in ("completed", "incomplete"), answered.status_details
        assert (refused.status, refused.status_details.error.code) == ("failed", "shutting_down")
        assert refused.status_details.error.type == "server_error"
        assert added.item.role == "user"  # the late user item is kept, only not answered
        (last_error,) = events.of_type("error")
        assert (last_error.error.code, last_error.error.type) == ("shutting_down", "server_error")
        assert events.items[-1] is last_error
        assert close_code == 1001


@pytest.mark.parametrize("grace", [True, False])
async def test_an_out_of_band_response_is_waited_for_and_ends_with_its_response_done(demo_server, grace):
    """With a grace, the stop waits for the out-of-band answer, which ends as it would have;
    without one (the app's on_shutdown at once), it is cut: response.done cancelled,
    `shutting_down`, before the session's last error."""
    async with demo_server() as (http, pipeline):
        pipeline.answers_to_limit = True  # (still running when the stop comes)
        context = http.app[SERVER_CONTEXT]
        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn, turn_detection=None)
                await conn.conversation.item.create(item=user_text("Hello."))
                limit = 24 if grace else 4000
                await conn.response.create(response={"conversation": "none", "max_output_tokens": limit})
                side = (await events.wait_for("response.created")).response.id
                if grace:
                    await asyncio.wait_for(drain(http.app, 120.0, asyncio.Event()), 120)
                await context.sessions.close_all()  # (the app's on_shutdown)
                await events.task
        finally:
            await client.close()
        (done,) = events.of_type("response.done")
        assert done.response.id == side
        if grace:
            assert done.response.status == "incomplete", done.response.status_details
        else:
            assert done.response.status == "cancelled"
            assert done.response.status_details.error.code == "shutting_down"
        assert events.items[-1].type == "error" and events.items[-1].error.code == "shutting_down"


async def test_the_queue_says_what_waits_and_what_came_once_the_server_was_stopping():
    stopping = False
    queue = TurnQueue(stopping=lambda: stopping)
    queue.put_nowait(QueuedSelect(None, "before"))
    stopping = True
    queue.put_nowait(QueuedSelect(None, "after"))
    assert queue.busy  # (waiting: a stop waits for these)
    taken = []
    async for work in queue.taken():
        taken.append((work.event_id, queue.taking_late))
        if len(taken) == 2:
            break
    assert taken == [("before", False), ("after", True)]
