"""WebRTC calls the OpenAI way (POST /v1/realtime/calls) against the real server and pipeline on
the demo checkpoint: the offer as plain SDP or as the multipart form the official `openai`
client sends, 201 with the SDP answer and the call id in Location, events on `oai-events`, the
call's session configuration applied, the user's words transcribed (a transcription call
answering nothing), a stored conversation continued, the deprecated /api/rtc/offer alias, hang-up (on the instance
holding the call or another one sharing its database), the SIP-only routes refused, every bad
request a 4xx in OpenAI's error shape; and the whole flow as OpenAI's clients run it, with an
ephemeral key, espeak speech, the answer's audio, barge-in and hang-up; and the beta API's flow,
its offer POSTed to /v1/realtime with a beta session's key."""

import json

import aiohttp
import numpy as np
import pytest

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.server.context import SERVER_CONTEXT
from kimiaudio.server.middleware.access import API_KEY_ENV

from helpers.audio import silence
from helpers.demo_server import kv_pool_full_again
from helpers.hostile_clients import INTERNAL_NAMES, offer_sdp
from helpers.openai_strict import check
from helpers.waiting import eventually

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
KEY = "calls-test-key-0123"


@pytest.fixture
def no_env_key(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)


@pytest.fixture
async def http(demo_server):
    async with demo_server(max_sessions=2) as (client, _):
        yield client


async def error_of(resp, status: int, code: str) -> dict:
    """The OpenAI-shaped error of a refused request, checked."""
    body = await resp.json()
    assert resp.status == status and body["error"]["code"] == code, (resp.status, body)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"] and not INTERNAL_NAMES.search(body["error"]["message"])
    return body["error"]


async def live_sessions(http) -> int:
    return len(http.app[SERVER_CONTEXT].sessions)


async def _no_sessions(http) -> bool:
    return await live_sessions(http) == 0


async def test_a_plain_sdp_call_is_answered_201_with_its_id_and_hung_up(http):
    client = RtcClient(ScriptedMic())
    status, answer = await client.connect(http)
    assert status == 201, answer
    assert client.response_headers["Content-Type"].startswith("application/sdp")
    assert client.response_headers["Location"] == f"/v1/realtime/calls/{answer['call_id']}"
    assert answer["call_id"].startswith("rtc_") and answer["sdp"].startswith("v=0")
    created = await client.wait_for("session.created")  # on the client's oai-events channel
    assert created["session"]["id"].startswith("sess_")
    assert client.channel.label == "oai-events"
    assert await live_sessions(http) == 1
    assert await client.hang_up(http) == 200
    assert await live_sessions(http) == 0
    await error_of(await http.post(f"/v1/realtime/calls/{answer['call_id']}/hangup"), 404, "call_not_found")
    await client.close()


async def test_the_call_session_configuration_applies(http):
    client = RtcClient(ScriptedMic())
    session = {"type": "realtime", "model": "gpt-realtime", "instructions": "Answer in one word."}
    status, _ = await client.connect(http, session={**session, "audio": {"input": {"turn_detection": None}}})
    assert status == 201
    created = (await client.wait_for("session.created"))["session"]
    assert created["instructions"] == "Answer in one word."
    assert created["type"] == "realtime" and created["audio"]["input"]["turn_detection"] is None  # GA shape
    await client.close()


async def test_calls_transcribe_the_users_words_and_a_transcription_call_answers_nothing(demo_server, speech):
    """A call hears with the server VAD; a realtime call starts transcribing the user's words
    ([server] transcribe_input, on by default: the page shows them) and answers; a transcription
    call (its `session` part's type) sends the words as deltas and a completion, stores them
    with the turn, and submits no answer."""
    async with demo_server() as (http, pipeline):
        for kind in ("realtime", "transcription"):
            mic = ScriptedMic()
            client = RtcClient(mic)
            status, _ = await client.connect(http, session={"type": kind})
            assert status == 201
            created = await client.wait_for("session.created")
            assert created["session"]["type"] == kind and created["session"]["audio"]["input"]["transcription"]
            answers = len(pipeline.requests)
            mic.say(np.concatenate([silence(0.3), speech[0], silence(1.0)]))
            committed = await client.wait_for("input_audio_buffer.committed")
            completed = await client.wait_for("conversation.item.input_audio_transcription.completed")
            assert completed["item_id"] == committed["item_id"] and completed["transcript"]
            deltas = client.of_type("conversation.item.input_audio_transcription.delta")
            assert "".join(d["delta"] for d in deltas).strip() == completed["transcript"]
            if kind == "realtime":
                await client.wait_for("response.done")
            await client.close()
            await eventually(lambda: _no_sessions(http), "the call closed")
            stored = await http.app[SERVER_CONTEXT].store.get_conversation(committed["conversation_id"])
            user = stored["turns"][committed["item_index"]]
            assert user["role"] == "user" and user["transcript"] == completed["transcript"]
            # One answer for the realtime call, none for the transcription call (closed now: none can come).
            assert len(pipeline.requests) - answers == (1 if kind == "realtime" else 0), kind
            assert bool(client.of_type("response.created")) == (kind == "realtime"), kind
        await kv_pool_full_again(pipeline)


@pytest.mark.parametrize("with_session", [True, False])
async def test_the_official_client_calls_with_an_ephemeral_key_and_hangs_up(no_env_key, demo_server, with_session):
    """README's example: the backend (API key) mints, the browser's client (the ephemeral key)
    sends the offer (raw SDP, or the multipart form with a session), the backend hangs up."""
    openai = pytest.importorskip("openai")
    async with demo_server(api_key=KEY) as (http, _):
        mic_client = RtcClient(ScriptedMic())
        offer = await mic_client.offer()
        backend = openai.AsyncOpenAI(base_url=str(http.make_url("/v1")), api_key=KEY, max_retries=0)
        try:
            secret = await backend.realtime.client_secrets.create(session={"type": "realtime", "instructions": "Hi."})
            browser = backend.with_options(api_key=secret.value)
            session = {"type": "realtime", "model": "gpt-realtime", "instructions": "Be brief."}
            raw = await browser.realtime.calls.with_raw_response.create(
                sdp=offer, **({"session": session} if with_session else {})
            )
            assert raw.status_code == 201 and raw.headers["content-type"].startswith("application/sdp")
            answer = raw.content.decode()
            await mic_client.answered(answer, raw.headers["location"])
            call_id = mic_client.call_id
            assert call_id.startswith("rtc_") and "a=fingerprint" in answer
            created = await mic_client.wait_for("session.created")
            assert created["session"]["instructions"] == ("Be brief." if with_session else "Hi.")
            for sip_only in (
                backend.realtime.calls.accept(call_id, type="realtime"),
                backend.realtime.calls.reject(call_id),
                backend.realtime.calls.refer(call_id, target_uri="tel:+14155550123"),
            ):
                with pytest.raises(openai.BadRequestError, match="SIP"):
                    await sip_only
            assert await backend.realtime.calls.hangup(call_id) is None
            assert await live_sessions(http) == 0
            with pytest.raises(openai.NotFoundError):
                await backend.realtime.calls.hangup(call_id)
        finally:
            await backend.close()
            await mic_client.close()


async def test_a_call_continues_a_stored_conversation(http):
    store = http.app[SERVER_CONTEXT].store
    conversation = await store.create_conversation()
    client = RtcClient(ScriptedMic())
    assert (await client.connect(http, conversation_id=conversation["id"]))[0] == 201
    created = await client.wait_for("session.created")
    assert created["session"]["conversation_id"] == conversation["id"]
    # Held by this call: a second one is 409, with Retry-After.
    other = RtcClient(ScriptedMic())
    status, body = await other.connect(http, conversation_id=conversation["id"])
    assert status == 409 and body["error"]["code"] == "conversation_busy"
    retry = int(other.response_headers["Retry-After"])
    assert retry >= 1 and f"try again in {retry} s" in body["error"]["message"]  # one figure, both places
    await other.close()
    await client.hang_up(http)
    await client.close()
    unknown = RtcClient(ScriptedMic())
    status, body = await unknown.connect(http, conversation_id="no-such-conversation")
    assert status == 404 and body["error"]["code"] == "conversation_not_found"
    await unknown.close()


async def test_a_full_server_answers_503(http):
    clients = [RtcClient(ScriptedMic()) for _ in range(3)]
    statuses = [(await c.connect(http))[0] for c in clients]
    assert statuses == [201, 201, 503]
    assert clients[2].response_headers["Retry-After"]
    # Hung up as OpenAI's flow ends a call: a peer closed before it connected sends nothing,
    # and its slot would wait out the silence limit instead.
    assert [await c.hang_up(http) for c in clients[:2]] == [200, 200]
    for c in clients:
        await c.close()

    async def freed():
        return await live_sessions(http) == 0

    await eventually(freed, "the closed calls' slots freed")


async def test_the_deprecated_offer_route_is_a_call_that_says_so(http):
    """POST /api/rtc/offer, kept for clients written before the calls route: the same call (its
    id hangs it up), the events in the beta shape it always had, and headers saying where to go."""
    client = RtcClient(ScriptedMic())
    resp = await http.post("/api/rtc/offer", json={"sdp": await client.offer(), "type": "offer"})
    body = await resp.json()
    assert resp.status == 200, body
    assert resp.headers["Deprecation"] == "true" and "</v1/realtime/calls>" in resp.headers["Link"]
    await client.answered(body["sdp"], f"/v1/realtime/calls/{body['call_id']}")
    created = await client.wait_for("session.created")
    assert "type" not in created["session"] and created["session"]["modalities"]  # the beta session object
    assert await client.hang_up(http) == 200
    await client.close()
    await eventually(lambda: _no_sessions(http), "the call's slot freed")


async def test_bad_calls_are_refused_in_openai_shape(http):
    sdp = await offer_sdp()
    calls = "/v1/realtime/calls"

    def sdp_body(text, content_type="application/sdp"):
        return http.post(calls, data=text, headers={"Content-Type": content_type})

    await error_of(await sdp_body(sdp, "text/plain"), 415, "unsupported_media_type")
    await error_of(await http.post(calls, json={"sdp": sdp}), 415, "unsupported_media_type")
    await error_of(await sdp_body("hello"), 400, "bad_offer")
    assert (await error_of(await sdp_body(" \r\n"), 400, "missing_required_parameter"))["param"] == "sdp"
    await error_of(await sdp_body(sdp.replace("a=fingerprint", "a=fingerprinted")), 400, "bad_offer")
    await error_of(await sdp_body(b"v=0\xff\xfe"), 400, "bad_offer")
    await error_of(await sdp_body("v=0\r\n" + "a=x\r\n" * 20000), 413, "too_large")

    def form(**parts):
        data = aiohttp.FormData()
        for name, (value, content_type) in parts.items():
            data.add_field(name, value, content_type=content_type)
        return http.post(calls, data=data)

    await error_of(await form(session=("{}", "application/json")), 400, "missing_required_parameter")
    await error_of(
        await form(sdp=(sdp, "application/sdp"), session=("[object Object]", "application/json")), 400, "invalid_json"
    )
    err = await error_of(
        await form(sdp=(sdp, "application/sdp"), session=(json.dumps({"voice": 7}), "application/json")),
        400,
        "invalid_value",
    )
    assert err["param"] == "session.voice"
    await error_of(
        await form(sdp=(sdp, "application/sdp"), session=('{"tools": [1]}', None)), 400, "unsupported_parameter"
    )
    err = await error_of(
        await form(sdp=(sdp, "application/sdp"), model=("gpt-realtime", None)), 400, "unknown_parameter"
    )
    assert err["param"] == "model"
    await error_of(
        await http.post(calls + "?model=gpt-2", data=sdp, headers={"Content-Type": "application/sdp"}),
        404,
        "model_not_found",
    )
    await error_of(await http.post(calls + "/rtc_nope/hangup"), 404, "call_not_found")
    await error_of(await http.post(calls + "/rtc_nope/accept", json={"type": "realtime"}), 400, "unsupported")
    assert await live_sessions(http) == 0 and http.app[SERVER_CONTEXT].sessions.num_reserved == 0


async def test_a_hangup_reaching_another_instance_ends_the_call(demo_server, postgres_url, tmp_path):
    async with (
        demo_server(tmp_path / "a", postgres_url) as (holder, _),
        demo_server(tmp_path / "b", postgres_url) as (other, _),
    ):
        client = RtcClient(ScriptedMic())
        assert (await client.connect(holder))[0] == 201
        await client.wait_for("session.created")
        resp = await other.post(f"/v1/realtime/calls/{client.call_id}/hangup")
        assert resp.status == 200, await resp.text()

        async def ended():
            return await live_sessions(holder) == 0

        await eventually(ended, "the call ended on the instance holding it")

        async def forgotten():  # the holder's next sync drops the ended call from the directory
            return (await other.post(f"/v1/realtime/calls/{client.call_id}/hangup")).status == 404

        await eventually(forgotten, "the ended call gone from the directory")
        await client.close()


async def test_the_openai_webrtc_flow_end_to_end(no_env_key, demo_server, speech):
    """A client secret minted with the API key (the official client), the offer to
    /v1/realtime/calls with it, espeak speech in, the answer's audio out, talking over it
    (barge-in), and the official client's hang-up; every event GA as the SDK's models hold it."""
    openai = pytest.importorskip("openai")
    async with demo_server(api_key=KEY) as (http, pipeline):
        pipeline.answers_to_limit = True  # a long answer, still playing when the user talks over it
        backend = openai.AsyncOpenAI(base_url=str(http.make_url("/v1")), api_key=KEY, max_retries=0)
        mic = ScriptedMic()
        client = RtcClient(mic)
        try:
            secret = await backend.realtime.client_secrets.create(
                expires_after={"anchor": "created_at", "seconds": 60},
                session={"type": "realtime", "instructions": "Answer at length.", "max_output_tokens": 300},
            )
            status, _ = await client.connect(http, key=secret.value)
            assert status == 201
            created = await client.wait_for("session.created")
            assert created["session"]["instructions"] == "Answer at length."
            assert created["session"]["max_output_tokens"] == 300

            mic.say(np.concatenate([silence(0.3), speech[0], silence(1.0)]))
            for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.committed", "response.created"):
                await client.wait_for(kind)
            started = await client.wait_for("output_audio_buffer.started")

            async def loud_frames():  # the answer's audio, on the media track
                return sum(r > 0.01 for r in client.frames_rms) >= 10

            await eventually(loud_frames, "the answer's audio received")
            mic.say(np.concatenate([speech[1], silence(1.0)]))  # talk over it
            await client.wait_for("input_audio_buffer.speech_started", count=2)
            done = await client.wait_for("response.done")
            assert done["response"]["id"] == started["response_id"]
            assert done["response"]["status"] == "cancelled"
            assert done["response"]["status_details"]["reason"] == "turn_detected"
            await client.wait_for("output_audio_buffer.cleared")
            await client.wait_for("response.created", count=2)  # what was said over it is answered

            with pytest.raises(openai.AuthenticationError):  # the browser's key cannot hang up
                await backend.with_options(api_key=secret.value).realtime.calls.hangup(client.call_id)
            assert await backend.realtime.calls.hangup(client.call_id) is None
            assert await live_sessions(http) == 0
            for event in client.events:
                check(event, "ga")
        finally:
            await backend.close()
            await client.close()
        await kv_pool_full_again(pipeline)


async def test_the_beta_webrtc_flow_posts_its_offer_to_the_realtime_route(no_env_key, demo_server, speech):
    """The beta API's browser flow: a key from client.beta.realtime.sessions.create, the SDP offer
    POSTed to /v1/realtime?model=... with it, events in the beta shape on `oai-events` (as the
    SDK's beta models hold them), a spoken turn answered, the call hung up with the API key."""
    openai = pytest.importorskip("openai")
    async with demo_server(api_key=KEY) as (http, pipeline):
        backend = openai.AsyncOpenAI(base_url=str(http.make_url("/v1")), api_key=KEY, max_retries=0)
        mic = ScriptedMic()
        client = RtcClient(mic)
        try:
            session = await backend.beta.realtime.sessions.create(
                model="gpt-4o-realtime-preview", instructions="Answer in one word."
            )
            offer = await client.offer()
            resp = await http.post(
                "/v1/realtime",
                params={"model": "gpt-4o-realtime-preview"},
                data=offer,
                headers={"Authorization": f"Bearer {session.client_secret.value}", "Content-Type": "application/sdp"},
            )
            assert resp.status == 201, await resp.text()
            assert resp.headers["Content-Type"].startswith("application/sdp")
            await client.answered(await resp.text(), resp.headers["Location"])
            created = await client.wait_for("session.created")
            assert created["session"]["instructions"] == "Answer in one word."
            assert "modalities" in created["session"]  # the beta session object, not the GA one

            mic.say(np.concatenate([silence(0.3), speech[0], silence(1.0)]))
            done = await client.wait_for("response.done")
            assert done["response"]["status"] in ("completed", "incomplete")  # the demo model may run to its limit
            assert any(e["type"] == "response.audio_transcript.done" for e in client.events)  # beta's name
            assert await backend.realtime.calls.hangup(client.call_id) is None
            assert await live_sessions(http) == 0
            for event in client.events:
                check(event, "beta")
        finally:
            await backend.close()
            await client.close()
        await kv_pool_full_again(pipeline)
