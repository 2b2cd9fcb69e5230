"""Guessing the API key (kimiaudio/server/middleware/key_guesses.py): after GUESS_LIMIT wrong keys
a client's keys are all refused, its right one too, until the window has passed; other clients
and this machine's own are not held back; the client behind a trusted proxy is the address
the proxy forwarded, whatever the client wrote before it."""

import ipaddress

import pytest

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import SERVER_CONTEXT
from kimiaudio.server.middleware.access import API_KEY_ENV
from kimiaudio.server.middleware.key_guesses import GUESS_LIMIT, GUESS_WINDOW_S, KeyGuesses

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
KEY = "s3cret-K3y_0123456789"


def from_(address: str, key: str | None = None) -> dict[str, str]:
    """Headers of a request the front (HAProxy on this machine) forwards from `address`."""
    headers = {"X-Forwarded-For": address}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return headers


@pytest.fixture
async def server(monkeypatch, demo_server):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    async with demo_server(api_key=KEY) as (client, _):
        yield client


async def status(response) -> int:
    await response.read()
    return response.status


async def test_a_guessing_client_is_refused_its_right_key_too(server):
    guesser, other = "203.0.113.7", "198.51.100.2"
    for n in range(GUESS_LIMIT):
        assert await status(await server.get("/api/status", headers=from_(guesser, f"guess-{n}"))) == 401
    refused = await server.get("/v1/models", headers=from_(guesser, KEY))
    body = await refused.json()
    assert refused.status == 429 and body["error"]["code"] == "too_many_wrong_keys"
    assert 0 < int(refused.headers["Retry-After"]) <= GUESS_WINDOW_S
    # What it wrote before the address the front forwarded is not believed.
    assert await status(await server.get("/v1/models", headers=from_(f"192.0.2.1, {guesser}", KEY))) == 429
    assert await status(await server.get("/v1/models", headers=from_(other, KEY))) == 200
    assert await status(await server.get("/api/auth", headers=from_(guesser))) == 200  # no key, no refusal


async def test_wrong_sign_ins_and_unknown_ephemeral_keys_are_guesses(server):
    guesser = "203.0.113.8"
    for n in range(GUESS_LIMIT // 2):
        wrong = await server.post("/api/signin", json={"api_key": f"guess-{n}"}, headers=from_(guesser))
        assert await status(wrong) == 401
    assert await status(await server.post("/api/signin", json={}, headers=from_(guesser))) == 401  # no guess
    for n in range(GUESS_LIMIT - GUESS_LIMIT // 2):
        unknown = await server.get("/v1/realtime", headers=from_(guesser, f"ek_{'A' * 40}{n:03d}"))
        assert await status(unknown) == 401
    signin = await server.post("/api/signin", json={"api_key": KEY}, headers=from_(guesser))
    assert signin.status == 429 and (await signin.json())["error"]["code"] == "too_many_wrong_keys"


async def test_this_machines_clients_are_not_counted(server):
    for n in range(2 * GUESS_LIMIT):
        assert await status(await server.get("/api/status", headers={"Authorization": f"Bearer guess-{n}"})) == 401
    assert await status(await server.get("/api/status", headers={"Authorization": f"Bearer {KEY}"})) == 200


async def test_the_official_client_is_told_to_wait(server):
    openai = pytest.importorskip("openai")
    guesses = server.app[SERVER_CONTEXT].key_guesses
    for _ in range(GUESS_LIMIT):
        guesses.wrong(ipaddress.ip_address("203.0.113.9"))
    api = openai.AsyncOpenAI(
        base_url=str(server.make_url("/v1")), api_key=KEY, max_retries=0, default_headers=from_("203.0.113.9")
    )
    try:
        with pytest.raises(openai.RateLimitError) as refused:
            await api.models.list()
    finally:
        await api.close()
    assert refused.value.code == "too_many_wrong_keys" and "wrong API keys" in refused.value.message


def test_the_window_slides_and_ipv6_counts_by_its_64():
    now = [1000.0]
    guesses = KeyGuesses(limit=3, window_s=60.0, clock=lambda: now[0])
    host = ipaddress.ip_address("2001:db8:1:2::10")
    for offset in (0.0, 10.0, 20.0):
        now[0] = 1000.0 + offset
        guesses.check(host)
        guesses.wrong(ipaddress.ip_address(f"2001:db8:1:2::{int(offset) + 11:x}"))  # same /64
    guesses.check(ipaddress.ip_address("2001:db8:1:3::10"))  # another /64
    with pytest.raises(ApiError) as refused:
        guesses.check(host)
    assert refused.value.status_code == 429 and refused.value.headers["Retry-After"] == "40"  # first + 60 - now
    now[0] = 1060.0  # the first guess has left the window: one more guess is allowed
    guesses.check(host)
    guesses.wrong(host)
    with pytest.raises(ApiError):
        guesses.check(host)  # the second and third are still within it
    now[0] = 1200.0
    guesses.check(host)


def test_clients_beyond_the_limit_are_forgotten_oldest_first(monkeypatch):
    monkeypatch.setattr("kimiaudio.server.middleware.key_guesses.MAX_CLIENTS", 2)
    now = [0.0]
    guesses = KeyGuesses(limit=1, window_s=60.0, clock=lambda: now[0])
    first, second, third = (ipaddress.ip_address(f"192.0.2.{n}") for n in (1, 2, 3))
    guesses.wrong(first)
    now[0] = 1.0
    guesses.wrong(second)
    guesses.wrong(third)  # the third client: the least recently seen (first) is forgotten
    guesses.check(first)
    for refused in (second, third):
        with pytest.raises(ApiError):
            guesses.check(refused)
