"""Turn detection switched off (session.update turn_detection null) while the server's VAD hears
the user, against the real server on the demo checkpoint: what the VAD thread was hearing at
that moment (an append from a call's sideband, the official `openai` client's, while a real
aiortc call's data channel sends the switch) starts no speech and commits no utterance after
it; and an utterance whose speech_started the client was told of gets its speech_stopped
before input_audio_buffer.cleared says its audio went, as the SDK's events promise a client
(a speech_stopped after each speech_started)."""

import asyncio
import base64
import contextlib
import threading

import numpy as np
import pytest

from kimiaudio.audio import pcm16
from kimiaudio.audio.resampling import resample
from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.server.context import SERVER_CONTEXT

from helpers.audio import silence
from helpers.realtime_events import Events, say
from helpers.realtime_sessions import client_of, connect, open_session, session_update, user_text
from helpers.waiting import eventually

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
KEY = "turn-switch-test-key-0123"


@contextlib.asynccontextmanager
async def held(executor):
    """The server's VAD thread held (its one worker waits) until the block ends; yields
    `queued(n)`, which returns once n pushes wait for it."""
    entered, let_go = threading.Event(), threading.Event()

    def hold():
        entered.set()
        let_go.wait(300)

    executor.submit(hold)

    async def queued(n: int) -> None:
        async def waiting():  # (the executor's own queue: nothing else tells when a push is in it)
            return executor._work_queue.qsize() >= n

        await eventually(waiting, f"{n} pushes waiting for the VAD thread")

    try:
        await asyncio.to_thread(entered.wait, 300)
        yield queued
    finally:
        let_go.set()


def as_append(pcm16k: np.ndarray) -> str:
    return base64.b64encode(pcm16.to_bytes(resample(pcm16k, 16000, 24000))).decode()


async def test_what_the_vad_thread_hears_at_a_switch_off_starts_no_turn(demo_server, speech, monkeypatch):
    monkeypatch.delenv("KIMIAUDIO_API_KEY", raising=False)
    async with demo_server(api_key=KEY) as (http, _):
        call = RtcClient(ScriptedMic())
        assert (await call.connect(http, key=KEY))[0] == 201
        await call.wait_for("session.created")
        port = http.server.port
        backend = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", websocket_base_url=f"ws://127.0.0.1:{port}/v1", api_key=KEY
        )
        try:
            async with backend.realtime.connect(call_id=call.call_id) as side:
                events = Events(side, "ga")
                await events.wait_for("session.created")
                async with held(http.app[SERVER_CONTEXT].vad_executor) as queued:
                    # A whole utterance in one append: what the VAD hears in it would be a turn.
                    await side.input_audio_buffer.append(audio=as_append(np.concatenate([speech[1], silence(1.0)])))
                    await queued(2)  # it, and the call's microphone's next frame
                    call.send({"type": "session.update", "session": session_update("ga", turn_detection=None)})
                    switched = await call.wait_for("session.updated")
                # The sideband's next event is taken once the append's push has returned, and
                # the session's queue is in order: an utterance committed would come before it.
                await side.conversation.item.create(item=user_text("after the switch", "item_after"))
                await call.wait_for("conversation.item.added", where=lambda e: e["item"]["id"] == "item_after")
        finally:
            await backend.close()
            await call.close()
    after = call.events[call.events.index(switched) + 1 :]
    heard = [e["type"] for e in after if e["type"].startswith(("input_audio_buffer.", "response."))]
    assert heard == [], heard
    assert [e["item"]["id"] for e in after if e["type"] == "conversation.item.added"] == ["item_after"]


async def test_a_switch_off_during_speech_stops_it_before_clearing_it(demo_server, speech):
    async with demo_server() as (http, _):
        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn)
                await say(conn, speech[0])  # (no silence after it: the user is still speaking)
                started = await events.wait_for("input_audio_buffer.speech_started")
                await conn.session.update(session=session_update("ga", turn_detection=None))
                updated = await events.wait_for("session.updated", count=2)
        finally:
            await client.close()
    after = events.items[events.position(started) + 1 : events.position(updated)]
    assert [e.type for e in after] == ["input_audio_buffer.speech_stopped", "input_audio_buffer.cleared"]
    assert after[0].item_id == started.item_id and after[0].audio_end_ms > started.audio_start_ms
