"""Ephemeral Realtime keys (POST /v1/realtime/client_secrets) on the real app: minted with the
official `openai` client and the API key only, `expires_after` honoured, the session bound to a
key applied when it opens a Realtime WebSocket session or a WebRTC call, refused (401 in
OpenAI's error shape) on every other route, once expired, or when unknown; without an API key
the routes stay open and keys still work; a key minted by one instance opens a session on
another that shares its PostgreSQL database."""

import pytest

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.bench.realtime_ws_client import RealtimeWsClient
from kimiaudio.server.context import SERVER_CONTEXT
from kimiaudio.server.middleware.access import API_KEY_ENV

from helpers.hostile_clients import fill_template, route_templates

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
KEY = "the-real-key-0123456789"
SECRETS = "/v1/realtime/client_secrets"
BOUND = {"type": "realtime", "model": "gpt-realtime", "instructions": "Speak like a pirate.", "voice": "kimi"}


@pytest.fixture
def no_env_key(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)


@pytest.fixture
async def server(no_env_key, demo_server):
    async with demo_server(api_key=KEY) as (client, _):
        yield client


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


async def mint(http, body: dict | None = None, key: str = KEY):
    return await http.post(SECRETS, json=body or {}, headers=bearer(key))


async def refused(resp, status: int, code: str) -> dict:
    body = await resp.json()
    assert resp.status == status and body["error"]["code"] == code, (resp.status, body)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


async def ws_session(http, key: str) -> tuple[int, dict | None]:
    """Open GET /v1/realtime with `key` as a browser would (subprotocol) -> (status, session.created's session)."""
    client = RealtimeWsClient()
    status = await client.connect(http, headers={"Sec-WebSocket-Protocol": f"realtime, openai-insecure-api-key.{key}"})
    if status != 101:
        return status, None
    created = await client.wait_for("session.created")
    await client.close()
    return status, created["session"]


async def test_the_official_client_mints_a_key(server):
    openai = pytest.importorskip("openai")
    api = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key=KEY, max_retries=0)
    now = server.app[SERVER_CONTEXT].store.clock()
    try:
        secret = await api.realtime.client_secrets.create(
            expires_after={"anchor": "created_at", "seconds": 120}, session=BOUND
        )
        default = await api.realtime.client_secrets.create()
        ephemeral = api.with_options(api_key=secret.value)
        with pytest.raises(openai.AuthenticationError):  # an ephemeral key mints nothing
            await ephemeral.realtime.client_secrets.create()
    finally:
        await api.close()
    later = server.app[SERVER_CONTEXT].store.clock()  # (minted between now and later, however slow)
    assert secret.value.startswith("ek_") and len(secret.value) > 40 and secret.value != default.value
    assert now + 119 <= secret.expires_at <= later + 121
    assert now + 599 <= default.expires_at <= later + 601  # OpenAI's default: 600 s
    assert secret.session.type == "realtime" and secret.session.id.startswith("sess_")
    assert secret.session.instructions == "Speak like a pirate."


async def test_the_beta_api_mints_a_key_with_its_session(server):
    """The beta API's POST /v1/realtime/sessions (client.beta.realtime.sessions.create): the
    session in the beta shape with its client_secret, a one-minute key that opens a session
    with what it bound."""
    openai = pytest.importorskip("openai")
    api = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key=KEY, max_retries=0)
    now = server.app[SERVER_CONTEXT].store.clock()
    try:
        session = await api.beta.realtime.sessions.create(
            model="gpt-4o-realtime-preview", instructions="Speak like a pirate.", modalities=["text"]
        )
        with pytest.raises(openai.BadRequestError) as info:
            await api.beta.realtime.sessions.create(voice="nobody-stored")
    finally:
        await api.close()
    later = server.app[SERVER_CONTEXT].store.clock()
    assert info.value.body["code"] == "invalid_value"
    assert session.instructions == "Speak like a pirate." and session.modalities == ["text"]
    key = session.client_secret.value
    assert key.startswith("ek_") and now + 59 <= session.client_secret.expires_at <= later + 61
    status, opened = await ws_session(server, key)
    assert status == 101 and opened["instructions"] == "Speak like a pirate."
    assert opened["output_modalities"] == ["text"]


async def test_the_beta_api_key_lives_as_its_client_secret_says(server):
    """POST /v1/realtime/sessions' `client_secret.expires_after` (the SDK's SessionCreateParams):
    the key lives that long, and a lifetime out of OpenAI's range is a 400 naming it."""
    openai = pytest.importorskip("openai")
    api = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key=KEY, max_retries=0)
    now = server.app[SERVER_CONTEXT].store.clock()
    try:
        session = await api.beta.realtime.sessions.create(
            instructions="Speak like a pirate.",
            client_secret={"expires_after": {"anchor": "created_at", "seconds": 900}},
        )
        with pytest.raises(openai.BadRequestError) as info:
            await api.beta.realtime.sessions.create(client_secret={"expires_after": {"seconds": 5}})
    finally:
        await api.close()
    later = server.app[SERVER_CONTEXT].store.clock()
    assert now + 899 <= session.client_secret.expires_at <= later + 901
    assert info.value.body["param"] == "client_secret.expires_after.seconds"
    status, opened = await ws_session(server, session.client_secret.value)
    assert status == 101 and opened["instructions"] == "Speak like a pirate."


async def test_the_beta_api_mints_a_transcription_sessions_key(server):
    """POST /v1/realtime/transcription_sessions (client.beta.realtime.transcription_sessions.create):
    beta's transcription session object with its client_secret, living as client_secret.expires_at
    says; the key opens a transcription session."""
    openai = pytest.importorskip("openai")
    from openai.types.beta.realtime import TranscriptionSession

    api = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key=KEY, max_retries=0)
    now = server.app[SERVER_CONTEXT].store.clock()
    try:
        created = await api.beta.realtime.transcription_sessions.with_raw_response.create(
            input_audio_transcription={"model": "gpt-4o-transcribe", "language": "en"},
            include=["item.input_audio_transcription.logprobs"],
            client_secret={"expires_at": {"anchor": "created_at", "seconds": 300}},
        )
        with pytest.raises(openai.BadRequestError) as info:
            await api.beta.realtime.transcription_sessions.create(client_secret={"expires_at": {"seconds": 5}})
    finally:
        await api.close()
    later = server.app[SERVER_CONTEXT].store.clock()
    body = created.http_response.json()
    session = TranscriptionSession.model_validate(body)
    assert info.value.body["param"] == "client_secret.expires_at.seconds"
    assert body["object"] == "realtime.transcription_session" and body["include"] == [
        "item.input_audio_transcription.logprobs"
    ]
    assert session.input_audio_transcription.language == "en"
    assert now + 299 <= session.client_secret.expires_at <= later + 301
    status, opened = await ws_session(server, session.client_secret.value)
    assert status == 101 and opened["type"] == "transcription"
    assert opened["audio"]["input"]["transcription"]["language"] == "en"
    for body, param in (  # the body is the session: errors name its own fields
        ({"include": ["bad"]}, "include"),
        ({"instructions": "Hi."}, "instructions"),
        ({"type": "realtime"}, "type"),
        ({"client_secret": {"ttl": 5}}, "client_secret.ttl"),
    ):
        answer = await server.post("/v1/realtime/transcription_sessions", json=body, headers=bearer(KEY))
        error = (await answer.json())["error"]
        assert answer.status == 400 and error["param"] == param and param in error["message"], (body, error)


@pytest.mark.parametrize(
    "session",
    [BOUND, {"type": "transcription", "audio": {"input": {"transcription": {"model": "gpt-4o-transcribe"}}}}],
    ids=["realtime", "transcription"],
)
async def test_the_answer_and_the_session_it_opens_are_as_the_sdk_models_them(server, session):
    """The answer validates strictly against the SDK's ClientSecretCreateResponse, and a
    transcription session bound to a key opens a transcription session."""
    from openai.types.realtime import ClientSecretCreateResponse

    body = await (await mint(server, {"session": session})).json()
    ClientSecretCreateResponse.model_validate(body, strict=False)
    assert body["session"]["type"] == session["type"]
    status, opened = await ws_session(server, body["value"])
    assert status == 101 and opened["type"] == session["type"]


async def test_the_bound_session_applies_to_websocket_sessions_and_calls(server):
    key = (await (await mint(server, {"session": BOUND})).json())["value"]
    status, session = await ws_session(server, key)
    assert status == 101 and session["instructions"] == "Speak like a pirate."
    status, session = await ws_session(server, key)  # a key opens sessions until it expires
    assert status == 101 and session["instructions"] == "Speak like a pirate."
    client = RtcClient(ScriptedMic())
    assert (await client.connect(server, key=key))[0] == 201
    assert (await client.wait_for("session.created"))["session"]["instructions"] == "Speak like a pirate."
    await client.close()
    # The call's own session overrides what the key bound.
    client = RtcClient(ScriptedMic())
    assert (await client.connect(server, key=key, session={"type": "realtime", "instructions": "Be brief."}))[0] == 201
    assert (await client.wait_for("session.created"))["session"]["instructions"] == "Be brief."
    await client.close()


async def test_an_ephemeral_key_opens_nothing_else(server):
    key = (await (await mint(server)).json())["value"]
    conversation = await server.app[SERVER_CONTEXT].store.create_conversation()
    checked = 0
    for method, template in route_templates(server.app):
        path = fill_template(template, id=conversation["id"])
        if path in ("/", "/api/auth", "/api/signin", "/api/signout", "/v1/realtime", "/v1/realtime/calls"):
            continue
        for how in (bearer(key), {"Sec-WebSocket-Protocol": f"openai-insecure-api-key.{key}"}):
            error = await refused(await server.request(method, path, headers=how), 401, "invalid_api_key")
            assert "ephemeral key" in error["message"], (method, path)
        checked += 1
    assert checked >= 15
    resp = await server.get(f"/api/conversations/{conversation['id']}", params={"api_key": key})
    await refused(resp, 401, "invalid_api_key")


async def test_expired_and_unknown_keys_are_refused(server):
    store = server.app[SERVER_CONTEXT].store
    key = (await (await mint(server, {"expires_after": {"anchor": "created_at", "seconds": 10}})).json())["value"]
    assert (await ws_session(server, key))[0] == 101
    real_clock = store.clock
    store.clock = lambda: real_clock() + 11
    try:
        error = await refused(await server.get("/v1/realtime", headers=bearer(key)), 401, "invalid_api_key")
        assert "expired" in error["message"]
        client = RtcClient(ScriptedMic())
        status, body = await client.connect(server, key=key)
        assert status == 401 and "expired" in body["error"]["message"]
        await client.close()
    finally:
        store.clock = real_clock
    for unknown in ("ek_" + "A" * 43, "ek_", key[:-1]):
        await refused(await server.get("/v1/realtime", headers=bearer(unknown)), 401, "invalid_api_key")
    assert len(server.app[SERVER_CONTEXT].sessions) == 0


@pytest.mark.parametrize(
    "body, param",
    [
        ({"expires_after": {"anchor": "created_at", "seconds": 9}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "created_at", "seconds": 7201}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "created_at", "seconds": "60"}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "now", "seconds": 60}}, "expires_after.anchor"),
        ({"expires_after": {"anchor": "created_at", "seconds": 60, "x": 1}}, "expires_after.x"),
        ({"expires_after": 60}, "expires_after"),
        ({"session": "realtime"}, "session"),
        ({"session": {"type": "realtime", "voice": "no-such-voice"}}, "session.voice"),
        ({"session": {"type": "realtime", "audio": {"output": {"voice": "nobody"}}}}, "session.audio.output.voice"),
        ({"session": {"type": "realtime", "turn_detection": {"type": "loud"}}}, "session.turn_detection.type"),
        ({"session": {"type": "realtime", "tool_choice": "required"}}, "session.tool_choice"),
        ({"session": {"type": "realtime", "model": "gpt-5"}}, "session.model"),
        ({"lifetime": 60}, "lifetime"),
    ],
)
async def test_bad_requests_for_a_key_are_400s_naming_the_field(server, body, param):
    resp = await mint(server, body)
    error = (await resp.json())["error"]
    assert resp.status in (400, 404) and error["param"] == param, error


async def test_without_an_api_key_the_routes_stay_open_and_keys_still_work(no_env_key, demo_server):
    async with demo_server() as (http, _):
        key = (await (await http.post(SECRETS, json={"session": BOUND})).json())["value"]
        assert key.startswith("ek_")
        status, session = await ws_session(http, key)
        assert status == 101 and session["instructions"] == "Speak like a pirate."
        assert (await http.get("/api/conversations", headers=bearer(key))).status == 200  # open anyway
        await refused(await http.get("/v1/realtime", headers=bearer("ek_unknown")), 401, "invalid_api_key")


async def test_a_key_minted_on_one_instance_opens_a_session_on_another(no_env_key, demo_server, postgres_url, tmp_path):
    async with (
        demo_server(tmp_path / "a", postgres_url, api_key=KEY) as (first, _),
        demo_server(tmp_path / "b", postgres_url, api_key=KEY) as (second, _),
    ):
        key = (await (await mint(first, {"session": BOUND})).json())["value"]
        status, session = await ws_session(second, key)
        assert status == 101 and session["instructions"] == "Speak like a pirate."
        client = RtcClient(ScriptedMic())
        assert (await client.connect(second, key=key))[0] == 201
        assert (await client.wait_for("session.created"))["session"]["instructions"] == "Speak like a pirate."
        await client.close()
