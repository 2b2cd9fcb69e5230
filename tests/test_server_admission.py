"""Admission and request bodies on a real server socket: the session cap holds against
concurrent offers whose bodies arrive slowly (the slot is checked and taken in one step), a
body that never arrives is answered 408 after server.body_timeout_s and holds no slot
meanwhile, nor does a client that hangs up mid-body."""

import asyncio
import json

import pytest

from helpers.hostile_clients import offer_sdp, post_head, raw_request

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CAP = 3
BODY_TIMEOUT_S = 4.0  # well past the slow offers' 1 s pause, which a loaded machine stretches


@pytest.fixture
async def http(demo_server):
    async with demo_server(max_sessions=CAP, body_timeout_s=BODY_TIMEOUT_S) as (client, _):
        yield client


async def active(http) -> int:
    return (await (await http.get("/api/status")).json())["sessions"]["active"]


async def handling(http, count: int, since: int, timeout: float = 120.0) -> None:
    """Wait until the server has started handling `count` requests since its count was `since`
    (their heads are in: what a request holds while its body comes is then held)."""
    server = http.server.runner.server
    async with asyncio.timeout(timeout):
        while server.requests_count - since < count:
            await asyncio.sleep(0.01)


async def test_concurrent_slow_offers_cannot_overfill_the_cap(http):
    port = http.server.port
    bodies = [
        json.dumps({"sdp": sdp, "type": "offer"}).encode()
        for sdp in await asyncio.gather(*(offer_sdp() for _ in range(CAP + 5)))
    ]
    # Every offer's first half arrives at once, its second half a second later.
    results = await asyncio.gather(
        *(raw_request(port, post_head(port, "/api/rtc/offer", len(body)), body, pause_s=1.0) for body in bodies)
    )
    statuses = sorted(status for status, _ in results)
    assert statuses == [200] * CAP + [503] * 5, statuses
    refused = [json.loads(body)["error"]["code"] for status, body in results if status == 503]
    assert set(refused) == {"server_full"}
    assert await active(http) == CAP


async def test_a_body_that_never_arrives_is_answered_408_and_holds_no_slot(http):
    port = http.server.port
    body = json.dumps({"sdp": await offer_sdp(), "type": "offer"}).encode()
    since = http.server.runner.server.requests_count
    stalled = asyncio.gather(
        *[
            raw_request(port, post_head(port, "/api/rtc/offer", len(body)), body, send_rest=False)
            for _ in range(CAP + 2)
        ]
    )
    await handling(http, CAP + 2, since)
    assert await active(http) == 0  # the stalled offers hold no slot: a real client still gets in
    status, _ = await raw_request(port, post_head(port, "/api/rtc/offer", len(body)), body)
    assert status == 200 and await active(http) == 1
    results = await stalled
    assert [status for status, _ in results] == [408] * (CAP + 2), results
    # body_timeout is the server's own answer at [server] body_timeout_s (the client would time
    # out without a status, and aiohttp has no body deadline): no wall-clock bound is needed.
    assert all(json.loads(body)["error"]["code"] == "body_timeout" for _, body in results)
    assert await active(http) == 1


async def test_a_client_hanging_up_mid_body_leaves_nothing_behind(http):
    port = http.server.port
    since = http.server.runner.server.requests_count
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f'{post_head(port, "/api/rtc/offer", 5000)}\r\n\r\n{{"sdp": '.encode())
    await writer.drain()
    await handling(http, 1, since)  # the offer is being handled, its body half in
    writer.close()
    await writer.wait_closed()
    async with asyncio.timeout(120):  # the server notices the hang-up and its connection goes
        while http.server.runner.server.connections:
            await asyncio.sleep(0.01)
    assert await active(http) == 0
    status, _ = await raw_request(port, post_head(port, "/api/rtc/offer", 2), b"{}")
    assert status == 400  # the server goes on
