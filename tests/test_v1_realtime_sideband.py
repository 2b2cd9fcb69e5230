"""OpenAI's sideband connection (GET /v1/realtime?call_id=, the official client's
`realtime.connect(call_id=...)`) against the real server and pipeline on the demo checkpoint,
beside a real aiortc call: it starts with a session.created of its own describing the call's
session, whether or not the call has a data channel, then gets the call's other events as the
data channel does (same event ids); its session.update and
response.create act on the call; it takes no session slot and closing it leaves the call going,
while the call's end closes it; an unknown call is a 404, and an ephemeral key cannot join."""

import asyncio

import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.server.context import SERVER_CONTEXT

from helpers.realtime_events import Events
from helpers.realtime_sessions import user_text

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
KEY = "sideband-test-key-0123"


def backend_of(http):
    port = http.server.port
    return openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1",
        websocket_base_url=f"ws://127.0.0.1:{port}/v1",
        api_key=KEY,
        max_retries=0,
    )


async def test_a_server_watches_and_steers_a_call_from_the_side(demo_server, monkeypatch):
    monkeypatch.delenv("KIMIAUDIO_API_KEY", raising=False)
    async with demo_server(api_key=KEY, max_sessions=1) as (http, pipeline):
        call = RtcClient(ScriptedMic())
        status, _ = await call.connect(http, key=KEY, session={"type": "realtime", "instructions": "Be brief."})
        assert status == 201
        await call.wait_for("session.created")
        backend = backend_of(http)
        try:
            async with backend.realtime.connect(call_id=call.call_id) as side:
                events = Events(side, "ga")
                created = (await events.wait_for("session.created")).session
                assert created.instructions == "Be brief." and created.id == call.events[0]["session"]["id"]
                assert len(http.app[SERVER_CONTEXT].sessions) == 1  # (no slot of its own: the server is full)

                # Its session.update and response.create act on the call; both see the events.
                await side.session.update(
                    session={"type": "realtime", "instructions": "Be briefer.", "output_modalities": ["text"]}
                )
                updated = await events.wait_for("session.updated")
                assert updated.session.instructions == "Be briefer."
                call_updated = await call.wait_for("session.updated")
                assert call_updated["event_id"] == updated.event_id  # the same event, numbered once
                await side.conversation.item.create(item=user_text("Hello from the side."))
                await side.response.create()
                done = await events.wait_for("response.done")
                assert done.response.status in ("completed", "incomplete"), done.response.status_details
                assert (await call.wait_for("response.done"))["response"]["id"] == done.response.id
            # Closing it leaves the call going.
            call.send({"type": "conversation.item.create", "item": user_text("Still here?")})
            assert (await call.wait_for("conversation.item.added", count=3))["item"]["role"] == "user"
            assert not http.app[SERVER_CONTEXT].sessions.live()[0].closed

            # The call's end closes it, the answer it cuts ended as the client's doing; a call that
            # is no more is a 404.
            pipeline.answers_to_limit = True  # (still playing at the hang-up)
            async with backend.realtime.connect(call_id=call.call_id) as side:
                events = Events(side, "ga")
                await events.wait_for("session.created")
                await side.session.update(session={"type": "realtime", "output_modalities": ["audio"]})
                await side.conversation.item.create(item=user_text("Tell me a story."))
                await side.response.create()
                await events.wait_for("output_audio_buffer.started")  # (the call plays it)
                await backend.realtime.calls.hangup(call.call_id)
                await asyncio.wait_for(events.task, 120)  # (the reader ends as the server closes it)
                cut = events.of_type("response.done")[-1].response
                assert (cut.status, cut.status_details.reason) == ("cancelled", "client_cancelled")
            resp = await http.get(f"/v1/realtime?call_id={call.call_id}", headers={"Authorization": f"Bearer {KEY}"})
            assert resp.status == 404 and (await resp.json())["error"]["code"] == "call_not_found"
        finally:
            await backend.close()
            await call.close()


async def test_an_ephemeral_key_cannot_join_a_call(demo_server, monkeypatch):
    monkeypatch.delenv("KIMIAUDIO_API_KEY", raising=False)
    async with demo_server(api_key=KEY) as (http, _):
        call = RtcClient(ScriptedMic())
        assert (await call.connect(http, key=KEY))[0] == 201
        backend = backend_of(http)
        try:
            secret = await backend.realtime.client_secrets.create(session={"type": "realtime"})
            resp = await http.get(
                f"/v1/realtime?call_id={call.call_id}", headers={"Authorization": f"Bearer {secret.value}"}
            )
            body = await resp.json()
            assert resp.status == 401 and "server's API key" in body["error"]["message"], body
            assert not http.app[SERVER_CONTEXT].sessions.live()[0].closed  # (the call goes on)
        finally:
            await backend.close()
            await call.close()


async def test_a_sideband_that_joins_before_the_call_opens_gets_one_session_created(demo_server, monkeypatch):
    """Joined before the call's data channel opened, the sideband gets its session.created at
    once, and not the channel's when it opens."""
    monkeypatch.delenv("KIMIAUDIO_API_KEY", raising=False)
    async with demo_server(api_key=KEY) as (http, _):
        call = RtcClient(ScriptedMic())
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/sdp"}
        resp = await http.post("/v1/realtime/calls", data=await call.offer(), headers=headers)
        assert resp.status == 201
        backend = backend_of(http)
        try:
            async with backend.realtime.connect(call_id=resp.headers["Location"].rsplit("/", 1)[-1]) as side:
                events = Events(side, "ga")
                await events.wait_for("session.created")
                await call.answered(await resp.text(), resp.headers["Location"])  # the channel opens now
                await call.wait_for("session.created")  # (the channel's own)
                await side.session.update(session={"type": "realtime", "instructions": "Hi."})
                await events.wait_for("session.updated")
                assert [e.type for e in events.items] == ["session.created", "session.updated"]
        finally:
            await backend.close()
            await call.close()


async def test_a_sideband_on_a_call_without_a_data_channel_starts_with_session_created(demo_server, monkeypatch):
    """A call may carry no data channel (an offer of the microphone alone): a sideband on it still
    gets a session.created first, and one only."""
    monkeypatch.delenv("KIMIAUDIO_API_KEY", raising=False)
    async with demo_server(api_key=KEY) as (http, _):
        call = RTCPeerConnection()
        call.addTrack(ScriptedMic())
        backend = backend_of(http)
        try:
            await call.setLocalDescription(await call.createOffer())
            headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/sdp"}
            resp = await http.post("/v1/realtime/calls", data=call.localDescription.sdp, headers=headers)
            assert resp.status == 201, await resp.text()
            await call.setRemoteDescription(RTCSessionDescription(sdp=await resp.text(), type="answer"))
            async with backend.realtime.connect(call_id=resp.headers["Location"].rsplit("/", 1)[-1]) as side:
                events = Events(side, "ga")
                await side.session.update(session={"type": "realtime", "instructions": "Hi."})
                await events.wait_for("session.updated")
                assert [e.type for e in events.items] == ["session.created", "session.updated"]
        finally:
            await backend.close()
            await call.close()


async def test_a_beta_shaped_call_cannot_be_joined(demo_server, monkeypatch):
    """A call of the deprecated /api/rtc/offer speaks the beta shape; a sideband speaks GA's."""
    monkeypatch.delenv("KIMIAUDIO_API_KEY", raising=False)
    async with demo_server(api_key=KEY) as (http, _):
        call = RtcClient(ScriptedMic())
        headers = {"Authorization": f"Bearer {KEY}"}
        resp = await http.post("/api/rtc/offer", json={"sdp": await call.offer(), "type": "offer"}, headers=headers)
        assert resp.status == 200
        call_id = (await resp.json())["call_id"]
        try:
            resp = await http.get(f"/v1/realtime?call_id={call_id}", headers=headers)
            body = await resp.json()
            assert resp.status == 400 and "beta" in body["error"]["message"], body
        finally:
            await call.close()
