"""Access control on the real app (kimiaudio/server/middleware/access.py): the API key on every route
but the page, the Host allow-list (DNS rebinding), the Origin check for state-changing
requests, and the warning for a server exposed without a key."""

import pytest

from kimiaudio.config import Config
from kimiaudio.errors import ConfigError
from kimiaudio.server.context import SERVER_CONTEXT
from kimiaudio.server.middleware.access import API_KEY_ENV, AccessPolicy, exposure_warning, key_matches

from helpers.hostile_clients import fill_template, route_templates

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
KEY = "s3cret-K3y_0123456789"
PUBLIC = {("GET", "/"), ("GET", "/api/auth")}


def _routes(app) -> list[tuple[str, str]]:
    """(method, concrete path) of every route, static files excepted."""
    return [(method, fill_template(template, id="abcDEF123_-")) for method, template in route_templates(app)]


@pytest.fixture
async def server(monkeypatch, demo_server):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    async with demo_server(api_key=KEY) as (client, _):
        yield client


async def test_every_route_but_the_page_needs_the_key(server):
    routes = _routes(server.app)
    assert len(routes) >= 8
    for method, path in routes:
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": f"Basic {KEY}"},
            {"Authorization": f"Bearer {KEY}x"},
        ):
            resp = await server.request(method, path, headers=headers)
            if (method, path) in PUBLIC:
                assert resp.status == 200, (method, path)
                continue
            assert resp.status == 401, (method, path, headers, resp.status)
            assert resp.headers["WWW-Authenticate"] == "Bearer"
            assert (await resp.json())["error"]["code"] == "unauthorized"
        resp = await server.request(method, path, headers={"Authorization": f"Bearer {KEY}"})
        assert resp.status != 401, (method, path)
    assert (await (await server.get("/api/auth")).json()) == {"required": True}
    assert (await server.get("/static/app.js")).status == 200


async def test_browser_forms_of_the_key(server):
    conversation = await server.app[SERVER_CONTEXT].store.create_conversation()
    path = f"/api/conversations/{conversation['id']}"
    assert (await server.get(path, params={"api_key": KEY})).status == 200  # an <audio> src
    assert (await server.get(path, params={"api_key": "nope"})).status == 401
    protocols = f"realtime, openai-insecure-api-key.{KEY}"
    assert (await server.get(path, headers={"Sec-WebSocket-Protocol": protocols})).status == 200


async def test_the_environment_variable_sets_the_key(monkeypatch, demo_server):
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    async with demo_server() as (client, _):
        assert (await client.get("/api/status")).status == 401
        assert (await client.get("/api/status", headers={"Authorization": "Bearer from-env"})).status == 200


async def test_no_key_configured_means_open(monkeypatch, demo_server):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    async with demo_server() as (client, _):
        assert (await (await client.get("/api/auth")).json()) == {"required": False}
        assert (await client.get("/api/status")).status == 200


@pytest.mark.parametrize(
    "host, allowed, status",
    [
        ("evil.example", [], 421),
        ("evil.example:8080", [], 421),
        ("127.0.0.1.evil.example", [], 421),
        ("localhost", [], 200),
        ("LOCALHOST:9", [], 200),
        ("127.0.0.1:1234", [], 200),
        ("[::1]:8080", [], 200),
        ("kimi.lan:8080", ["kimi.lan"], 200),
        ("localhost", ["kimi.lan"], 421),
        ("anything", ["*"], 200),
    ],
)
async def test_host_allow_list(monkeypatch, host, allowed, status, demo_server):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    async with demo_server(allowed_hosts=allowed) as (client, _):
        for path in ("/", "/api/status", "/api/conversations"):
            resp = await client.get(path, headers={"Host": host})
            assert resp.status == status, (host, path, await resp.text())
        if status == 421:
            assert "allowed_hosts" in (await resp.json())["error"]["message"]


async def test_origin_check_for_state_changing_requests(monkeypatch, demo_server):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    async with demo_server(allowed_origins=["https://app.example"]) as (
        client,
        _,
    ):
        own = f"http://127.0.0.1:{client.server.port}"
        conversation = await client.app[SERVER_CONTEXT].store.create_conversation()
        path = f"/api/conversations/{conversation['id']}"
        for origin in (
            "http://evil.example",
            "null",
            f"http://127.0.0.1:{client.server.port + 1}",
            f"https://127.0.0.1:{client.server.port}",
            "http://[::1",
        ):
            resp = await client.post("/api/rtc/offer", json={}, headers={"Origin": origin})
            assert resp.status == 403 and (await resp.json())["error"]["code"] == "forbidden_origin", origin
            assert (await client.delete(path, headers={"Origin": origin})).status == 403
            upgrade = {"Origin": origin, "Upgrade": "websocket", "Connection": "Upgrade"}
            assert (await client.get("/api/status", headers=upgrade)).status == 403
            assert (await client.get(path, headers={"Origin": origin})).status == 200  # reading is not changing
        for origin in (own, own.upper(), "https://app.example", "https://APP.example:443"):
            resp = await client.post("/api/rtc/offer", json={}, headers={"Origin": origin})
            assert resp.status == 400, origin  # past the check: the empty offer itself is refused
        assert (await client.post("/api/rtc/offer", json={})).status == 400  # no Origin: not a browser
        assert (await client.delete(path, headers={"Origin": own})).status == 200


def test_key_compare_and_exposure_warning(monkeypatch):
    assert key_matches("abc", "abc") and not key_matches("abd", "abc") and not key_matches("ab", "abc")
    assert not key_matches(None, "abc") and not key_matches("\udcff", "abc")
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    config = Config()
    for host, warned in (
        ("127.0.0.1", False),
        ("localhost", False),
        ("::1", False),
        ("0.0.0.0", True),
        ("192.168.1.5", True),
    ):
        config.server.host = host
        assert bool(exposure_warning(config, AccessPolicy.from_config(config))) == warned, host
    config.server.api_key = "k"
    assert exposure_warning(config, AccessPolicy.from_config(config)) is None
    for bad in ("with space", "ключ", "tab\t"):
        config.server.api_key = bad
        with pytest.raises(ConfigError, match="server.api_key"):
            AccessPolicy.from_config(config)
