"""Access control on the real app (kimiaudio/server/middleware/access.py): the API key on every route
but the page, the page's sign-in (a cookie for the page's routes, never the key kept in the
browser), the Host allow-list (DNS rebinding), the Origin check for state-changing requests,
and the warning for a server exposed without a key. Ephemeral keys: test_server_ephemeral_keys.py."""

import aiohttp
import pytest

from kimiaudio.config import Config
from kimiaudio.errors import ConfigError
from kimiaudio.server.context import SERVER_CONTEXT
from kimiaudio.server.middleware.access import API_KEY_ENV, AccessPolicy, exposure_warning, key_matches, key_warning

from helpers.hostile_clients import fill_template, route_templates

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
KEY = "s3cret-K3y_0123456789"
PUBLIC = {("GET", "/"), ("GET", "/api/auth"), ("POST", "/api/signin"), ("POST", "/api/signout")}


def signin_cookie(client) -> str:
    """The name of the sign-in cookie of the server `client` (aiohttp's test client) talks to."""
    return f"kimiaudio_signin_{client.server.port}"


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
                assert resp.status != 401 or path == "/api/signin", (method, path)
                continue
            assert resp.status == 401, (method, path, headers, resp.status)
            assert resp.headers["WWW-Authenticate"] == "Bearer"
            assert (await resp.json())["error"]["code"] == "unauthorized"
        resp = await server.request(method, path, headers={"Authorization": f"Bearer {KEY}"})
        assert resp.status != 401, (method, path)
    assert (await (await server.get("/api/auth")).json()) == {"required": True, "signed_in": False}
    assert (await server.get("/static/app.js")).status == 200


async def test_the_page_signs_in_once_and_keeps_a_cookie_not_the_key(server):
    refused = await server.post("/api/signin", json={"api_key": "wrong"})
    assert refused.status == 401 and (await refused.json())["error"]["code"] == "invalid_api_key"
    assert "Set-Cookie" not in refused.headers
    resp = await server.post("/api/signin", json={"api_key": KEY})
    assert resp.status == 200
    name = signin_cookie(server)
    cookie = resp.cookies[name]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
    assert KEY not in cookie.value and int(cookie["max-age"]) == 12 * 3600 and not cookie["secure"]
    behind_tls = await server.post("/api/signin", json={"api_key": KEY}, headers={"X-Forwarded-Proto": "https"})
    assert behind_tls.cookies[name]["secure"]  # a front that ends TLS (deploy/haproxy.cfg)
    server.session.cookie_jar.clear()  # the cookie goes only where it is sent below
    signed = {"Cookie": f"{name}={cookie.value}"}
    assert (await (await server.get("/api/auth", headers=signed)).json()) == {"required": True, "signed_in": True}
    # The cookie opens the page's routes, and mints the page's ephemeral keys...
    assert (await server.get("/api/conversations", headers=signed)).status == 200
    assert (await server.get("/api/status", headers=signed)).status == 200
    minted = await server.post("/api/client_secrets", json={}, headers=signed)
    assert minted.status == 200 and (await minted.json())["value"].startswith("ek_")
    # ...and nothing outside /api/: /v1 (minting included) and operations need the key itself.
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/realtime/client_secrets"), ("GET", "/metrics")):
        assert (await server.request(method, path, headers=signed)).status == 401, path
    assert (await server.get("/api/conversations", headers={"Cookie": f"{name}=forged"})).status == 401
    out = await server.post("/api/signout", headers=signed)
    assert out.status == 200 and out.cookies[name].value == ""
    assert (await server.get("/api/conversations", headers=signed)).status == 401  # gone from the store too


async def test_two_servers_on_one_host_keep_their_sign_ins_apart(monkeypatch, demo_server, tmp_path):
    """A browser sends a host's cookies to every port of it: one browser (one cookie jar)
    signed in to two servers on 127.0.0.1 and signing out of one stays signed in to the other."""
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    browser = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))  # unsafe: cookies for an IP
    try:
        async with (
            demo_server(tmp_path / "a", api_key=KEY) as (first, _),
            demo_server(tmp_path / "b", api_key=KEY) as (second, _),
        ):
            urls = [str(client.make_url("")) for client in (first, second)]

            async def signed_in() -> list[bool]:
                return [(await (await browser.get(f"{url}/api/auth")).json())["signed_in"] for url in urls]

            for url in urls:
                assert (await browser.post(f"{url}/api/signin", json={"api_key": KEY})).status == 200
            assert await signed_in() == [True, True]
            assert (await browser.post(f"{urls[1]}/api/signout", headers={"Origin": urls[1]})).status == 200
            assert await signed_in() == [True, False]
    finally:
        await browser.close()


async def test_a_new_api_key_voids_the_sign_ins_and_ephemeral_keys_of_the_old(monkeypatch, demo_server, tmp_path):
    """Changing the API key is how an operator revokes it: what was issued under the old key
    (a page's cookie, an ek_ key) is unknown to the server restarted with the new one, on the
    same store, and what the new key issues works."""
    monkeypatch.delenv(API_KEY_ENV, raising=False)

    async def issue(client, key: str) -> tuple[dict, dict]:
        cookie = (await client.post("/api/signin", json={"api_key": key})).cookies[signin_cookie(client)].value
        client.session.cookie_jar.clear()
        minted = await client.post("/v1/realtime/client_secrets", json={}, headers={"Authorization": f"Bearer {key}"})
        ephemeral = (await minted.json())["value"]
        return {"Cookie": f"{signin_cookie(client)}={cookie}"}, {"Authorization": f"Bearer {ephemeral}"}

    async def granted(client, signed: dict, ephemeral: dict) -> tuple[int, int]:
        page = await client.get("/api/conversations", headers=signed)
        opened = await client.get("/v1/realtime", headers=ephemeral)  # not a WebSocket: 400 once the key passes
        return page.status, opened.status

    async with demo_server(tmp_path / "data", api_key="old-key-123456") as (client, _):
        old = await issue(client, "old-key-123456")
        assert await granted(client, *old) == (200, 400)
    async with demo_server(tmp_path / "data", api_key="new-key-654321") as (client, _):
        assert await granted(client, *old) == (401, 401)
        assert await granted(client, *await issue(client, "new-key-654321")) == (200, 400)


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
        assert (await (await client.get("/api/auth")).json()) == {"required": False, "signed_in": False}
        assert (await (await client.post("/api/signin", json={})).json()) == {"required": False}
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


async def test_an_allowed_origins_page_calls_cross_origin(monkeypatch, demo_server):
    """An app's page on an allowed origin calls the server as OpenAI's browser examples call
    OpenAI (middleware/cors.py): its preflight is answered without a key, every answer (errors
    and streams too) lets it read the body, Location and Retry-After; no other origin gets that."""
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    async with demo_server(api_key=KEY, allowed_origins=["https://app.example"]) as (client, _):
        preflight = {
            "Origin": "https://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os",
        }
        resp = await client.options("/v1/realtime/calls", headers=preflight)
        assert resp.status == 204
        assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert "POST" in resp.headers["Access-Control-Allow-Methods"]
        assert resp.headers["Access-Control-Allow-Headers"] == "authorization,content-type,x-stainless-os"
        assert "Access-Control-Allow-Credentials" not in resp.headers
        refused = await client.options("/v1/realtime/calls", headers={**preflight, "Origin": "http://evil.example"})
        assert refused.status == 403 and "Access-Control-Allow-Origin" not in refused.headers

        minted = await client.post(
            "/v1/realtime/client_secrets",
            json={},
            headers={"Origin": "https://app.example", "Authorization": f"Bearer {KEY}"},
        )
        assert minted.status == 200 and minted.headers["Access-Control-Allow-Origin"] == "https://app.example"
        key = (await minted.json())["value"]
        bad_offer = await client.post(
            "/v1/realtime/calls",
            data="v=0",
            headers={
                "Origin": "https://app.example",
                "Authorization": f"Bearer {key}",
                "Content-Type": "application/sdp",
            },
        )
        assert bad_offer.status == 400 and bad_offer.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert "Location" in bad_offer.headers["Access-Control-Expose-Headers"]
        unkeyed = await client.post("/v1/realtime/calls", headers={"Origin": "https://app.example"})
        assert unkeyed.status == 401 and unkeyed.headers["Access-Control-Allow-Origin"] == "https://app.example"
        streamed = await client.post(  # prepared by its handler, before any middleware sees it
            "/v1/chat/completions",
            json={
                "model": "kimi-audio-7b-instruct",
                "stream": True,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "Hi"}],
            },
            headers={"Origin": "https://app.example", "Authorization": f"Bearer {KEY}"},
        )
        assert streamed.status == 200 and streamed.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert (await streamed.read()).rstrip().endswith(b"data: [DONE]")
        own = await client.get("/api/auth", headers={"Origin": f"http://127.0.0.1:{client.server.port}"})
        assert own.status == 200 and "Access-Control-Allow-Origin" not in own.headers  # same origin: no need

        # The page's sign-in cookie is the page's own: a browser sends it from any origin of the
        # same site (another port of 127.0.0.1 here), but an allowed origin acts with a key of its
        # own, never with the page's authority.
        cookie = (await client.post("/api/signin", json={"api_key": KEY})).cookies[signin_cookie(client)].value
        client.session.cookie_jar.clear()
        signed = {"Cookie": f"{signin_cookie(client)}={cookie}"}
        page = {**signed, "Origin": f"http://127.0.0.1:{client.server.port}"}
        sibling = {**signed, "Origin": "https://app.example"}
        assert (await client.post("/api/client_secrets", json={}, headers=page)).status == 200
        refused = await client.post("/api/client_secrets", json={}, headers=sibling)
        assert refused.status == 401 and (await refused.json())["error"]["code"] == "unauthorized"
        assert (await client.get("/api/conversations", headers=signed)).status == 200  # no Origin: the page's GET


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
    # A key easy to guess, or one some clients cannot send: a warning at start, naming why.
    for key, why in (("k", "1 characters long"), ("a+b/c=" * 4, "holds + / =")):
        config.server.api_key = key
        assert why in key_warning(AccessPolicy.from_config(config))
    config.server.api_key = "Kx2_-~.q9" * 3
    assert key_warning(AccessPolicy.from_config(config)) is None
    for bad in ("with space", "ключ", "tab\t"):
        config.server.api_key = bad
        with pytest.raises(ConfigError, match="server.api_key"):
            AccessPolicy.from_config(config)
