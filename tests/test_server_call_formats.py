"""Audio formats on a WebRTC call, with a real aiortc peer against the real server on the demo
checkpoint: the call's media is its negotiated codec, so a session (the call's `session` part,
a session.update, a response.create) naming OpenAI's G.711 formats is taken, GA and beta, and
its other fields apply; the data channel's audio stays pcm16, as the session says. On the
Realtime WebSocket, where the format is the events' audio, G.711 is still refused."""

import pytest

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.server.middleware.access import API_KEY_ENV

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
PCMU = {"type": "audio/pcmu"}


@pytest.fixture
def no_env_key(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)


async def test_a_ga_call_takes_g711_formats_and_the_other_fields(no_env_key, demo_server):
    async with demo_server() as (http, _):
        client = RtcClient(ScriptedMic())
        try:
            audio = {"input": {"format": PCMU}, "output": {"format": PCMU}}
            status, answer = await client.connect(
                http, session={"type": "realtime", "instructions": "First.", "audio": audio}
            )
            assert status == 201, answer
            created = (await client.wait_for("session.created"))["session"]
            assert created["instructions"] == "First."
            assert created["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}

            client.send(
                {
                    "type": "session.update",
                    "session": {"type": "realtime", "instructions": "Second.", "audio": audio},
                }
            )
            session = (await client.wait_for("session.updated"))["session"]
            assert session["instructions"] == "Second."
            assert session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
            client.send({"type": "response.create", "response": {"audio": {"output": {"format": PCMU}}}})
            await client.wait_for("response.created")
            assert not client.of_type("error"), client.of_type("error")
        finally:
            await client.close()


async def test_a_beta_call_takes_g711_formats_and_the_other_fields(no_env_key, demo_server):
    async with demo_server() as (http, _):
        client = RtcClient(ScriptedMic())
        try:
            offer = await client.offer()
            resp = await http.post(
                "/v1/realtime",
                params={"model": "gpt-4o-realtime-preview"},
                data=offer,
                headers={"Content-Type": "application/sdp"},
            )
            assert resp.status == 201, await resp.text()
            await client.answered(await resp.text(), resp.headers["Location"])
            await client.wait_for("session.created")
            session = {"instructions": "Beta.", "input_audio_format": "g711_ulaw", "output_audio_format": "g711_alaw"}
            client.send({"type": "session.update", "session": session})
            got = (await client.wait_for("session.updated"))["session"]
            assert got["instructions"] == "Beta." and got["input_audio_format"] == "pcm16"
            assert not client.of_type("error"), client.of_type("error")
        finally:
            await client.close()


async def test_the_websocket_still_refuses_g711(demo_server):
    async with demo_server() as (http, _):
        async with http.ws_connect("/v1/realtime?model=gpt-realtime") as ws:
            assert (await ws.receive_json())["type"] == "session.created"
            await ws.send_json(
                {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"format": PCMU}}}}
            )
            event = await ws.receive_json()
            while event["type"] != "error":
                event = await ws.receive_json()
            assert event["error"]["code"] == "unsupported_format"
            assert event["error"]["param"] == "session.audio.input.format"
