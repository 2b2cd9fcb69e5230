"""Which data channel of a WebRTC call carries its events, with real aiortc peers against the real
server on the demo checkpoint: the one named `oai-events` (OpenAI's), whatever the client opens
besides it and in whatever order; on the deprecated /api/rtc/offer, also one named `events`
(the page's before the calls route). The events' channel's messages are taken in the order they
came, as a WebSocket's are."""

import asyncio
import base64
import json

import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from kimiaudio.audio import pcm16
from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic

from helpers.waiting import eventually

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
async def http(demo_server):
    async with demo_server() as (client, _):
        yield client


async def test_a_channel_of_the_clients_own_opened_first_is_not_the_events_one(http):
    """A client opens a channel of its own, then `oai-events`: the events come on `oai-events`,
    where its session.update is answered, and nothing comes on its own."""
    client = RtcClient(ScriptedMic())
    mine = client.pc.createDataChannel("mine")  # (before RtcClient's `oai-events`)
    on_mine: list[dict] = []
    mine.on("message", lambda message: on_mine.append(json.loads(message)))
    try:
        status, answer = await client.connect(http)
        assert status == 201, answer

        async def first_event():
            return client.events or on_mine

        await eventually(first_event, "an event on either channel")
        assert [e["type"] for e in on_mine] == [] and client.events[0]["type"] == "session.created"
        client.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}})
        assert (await client.wait_for("session.updated"))["session"]["instructions"] == "Be brief."
        assert on_mine == []
    finally:
        await client.close()


async def test_the_deprecated_offer_route_takes_the_old_pages_events_channel(http):
    """The page's channel was named `events` before the calls route: /api/rtc/offer, kept for
    such clients, carries its events there."""
    pc = RTCPeerConnection()
    arrived: asyncio.Queue[dict] = asyncio.Queue()
    pc.createDataChannel("events").on("message", lambda message: arrived.put_nowait(json.loads(message)))
    pc.addTrack(ScriptedMic())
    try:
        await pc.setLocalDescription(await pc.createOffer())
        resp = await http.post("/api/rtc/offer", json={"sdp": pc.localDescription.sdp, "type": "offer"})
        body = await resp.json()
        assert resp.status == 200, body
        await pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type="answer"))
        first = await asyncio.wait_for(arrived.get(), 120)  # (the limit catches a hang, not slowness)
        assert first["type"] == "session.created"
    finally:
        await pc.close()


async def test_a_response_create_sent_behind_a_commit_answers_what_was_committed(http, speech_16k):
    """Push-to-talk with noise reduction: appends, a commit and a response.create sent at once.
    The commit waits for the VAD thread (the reducer's audio); the response.create behind it must
    still be taken after it, and answer the committed turn (not fail with no user turn)."""
    client = RtcClient(ScriptedMic())
    try:
        status, answer = await client.connect(http)
        assert status == 201, answer
        await client.wait_for("session.created")
        audio_in = {"turn_detection": None, "format": {"type": "audio/pcm", "rate": 16000}}
        audio_in["noise_reduction"] = {"type": "near_field"}
        client.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": audio_in}}})
        await client.wait_for("session.updated")
        data = pcm16.to_bytes(speech_16k)
        for start in range(0, len(data), 16000):  # (half a second each: a data-channel message is small)
            client.send(
                {"type": "input_audio_buffer.append", "audio": base64.b64encode(data[start : start + 16000]).decode()}
            )
        client.send({"type": "input_audio_buffer.commit"})
        client.send({"type": "response.create"})
        done = await client.wait_for("response.done")
        assert done["response"]["status"] != "failed", done["response"]
        committed = await client.wait_for("input_audio_buffer.committed")
        types = [e["type"] for e in client.events]
        assert client.events.index(committed) < types.index("response.created")
    finally:
        await client.close()
