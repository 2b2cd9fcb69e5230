"""A client hanging up while work waits in its session's queue, with the official `openai` client
against the server app on the demo checkpoint (its pipeline recording what it was asked):
closing cancels the answer that plays, keeps what the client committed, and starts nothing
more. A response.create queued behind the playing answer never reaches the pipeline (it would
generate for nobody: minutes of a decode slot on a real model), nor does the transcription of
the audio committed before it; no empty answer is stored, no task of the session is left
pending, and the conversation goes on from the turn the client committed last."""

import asyncio

import pytest

from kimiaudio.server.context import SERVER_CONTEXT

from helpers.demo_server import kv_pool_full_again
from helpers.realtime_events import say
from helpers.realtime_sessions import client_of, connect, open_session, user_text
from helpers.waiting import eventually

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow


def pending_waits() -> list[asyncio.Task]:
    """Tasks still waiting on an asyncio.Event (a response's recorder waits on two while it
    waits for the answer's first audio)."""
    return [t for t in asyncio.all_tasks() if not t.done() and t.get_coro().__qualname__ == "Event.wait"]


async def test_a_response_queued_behind_the_answer_never_starts_once_the_client_hangs_up(demo_server, speech_16k):
    async with demo_server() as (http, pipeline):
        pipeline.answers_to_limit = True  # the first answer still plays when the client hangs up
        client = client_of(http)
        sessions = http.app[SERVER_CONTEXT].sessions
        try:
            async with connect(client, "ga") as conn:
                transcribed = {"model": "whisper-1"}
                events = await open_session(conn, turn_detection=None, max_output_tokens=400, transcription=transcribed)
                (socket,) = sessions.live()
                await conn.conversation.item.create(item=user_text("Tell me a story."))
                await conn.response.create()
                conversation_id = (await events.wait_for("response.created")).response.conversation_id
                await events.wait_for("response.output_audio.delta")  # it plays
                # The turn and the response wait for the answer to have played; the hang-up comes first.
                await say(conn, speech_16k)
                await conn.input_audio_buffer.commit()
                await conn.response.create()
            # The socket reads the two events, then the hang-up, which closes the session.

            async def hung_up():
                return socket.closed

            await eventually(hung_up, "the hang-up seen")
            await socket.close()  # returns once that close has ended

            await kv_pool_full_again(pipeline)
            assert len(pipeline.requests) == 1, pipeline.requests[1:]  # the first answer alone
            assert pipeline.transcriptions == []
            assert not pending_waits(), pending_waits()
            stored = await (await http.get(f"/api/conversations/{conversation_id}")).json()
            turns = [(t["role"], t["has_audio"], t["interrupted"]) for t in stored["turns"]]
            assert turns == [("user", False, False), ("assistant", True, True), ("user", True, False)], turns

            # Continued, the conversation answers the item committed last.
            pipeline.answers_to_limit = False
            async with connect(client, "ga") as conn:
                events = await open_session(conn, turn_detection=None)
                await conn.send({"type": "conversation.select", "conversation_id": conversation_id})
                await events.wait_for("session.updated", count=2)
                await conn.response.create()
                done = await events.wait_for("response.done")
            assert done.response.status in ("completed", "incomplete"), done.response.status_details
            assert pipeline.requests[-1].user_audio is not None  # the speech committed before the hang-up
        finally:
            await client.close()
