"""REST routes and their errors (kimiaudio/server/routes.py): status, offer validation and the
session cap, the conversation API, the static page. Bad input gets a JSON 4xx, never a traceback."""

import asyncio
import io

import numpy as np
import pytest
import soundfile as sf

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.server.context import SERVER_CONTEXT


@pytest.fixture
async def http(demo_server):
    """The server with the real pipeline on the demo checkpoint, and room for one session."""
    async with demo_server(max_sessions=1) as (client, _):
        yield client


async def _error(resp, status, code):
    assert resp.status == status, await resp.text()
    body = await resp.json()
    assert body["error"]["code"] == code and body["error"]["message"]
    assert "Traceback" not in body["error"]["message"]
    return body["error"]["message"]


async def _byte_ranges(http, url: str) -> None:
    """A media element's Range requests (Safari's <audio> plays only from a server that answers
    them): one range is 206 with its bytes, one past the end 416, anything else the whole body."""
    whole = await (await http.get(url)).read()
    size = len(whole)
    for header, start, stop in (("bytes=0-1", 0, 2), ("bytes=100-", 100, size), ("bytes=-10", size - 10, size)):
        resp = await http.get(url, headers={"Range": header})
        assert resp.status == 206 and resp.headers["Accept-Ranges"] == "bytes", header
        assert resp.headers["Content-Range"] == f"bytes {start}-{stop - 1}/{size}"
        assert await resp.read() == whole[start:stop]
    for header in (f"bytes={size}-", "bytes=-0"):  # no byte of the body
        resp = await http.get(url, headers={"Range": header})
        await _error(resp, 416, "range_not_satisfiable")
        assert resp.headers["Content-Range"] == f"bytes */{size}"
    for header in ("bytes=0-1,5-9", "items=0-1", "bytes=9-2"):  # not one plain byte range: ignored
        resp = await http.get(url, headers={"Range": header})
        assert resp.status == 200 and await resp.read() == whole, header
    resp = await http.get(url, headers={"Range": "bytes=0-1", "If-Range": '"an-etag"'})  # no validator matches
    assert resp.status == 200 and await resp.read() == whole


async def test_page_static_files_and_status(http):
    resp = await http.get("/")
    assert resp.status == 200 and '<script src="/static/app.js">' in await resp.text()
    for name in ("app.js", "style.css"):
        assert (await http.get(f"/static/{name}")).status == 200
    status = await (await http.get("/api/status")).json()
    assert status["status"] == "ok" and status["demo_weights"] is True and status["demo_message"]
    assert status["sessions"] == {"active": 0, "max": 1}
    pool = status["pipeline"]
    assert pool["kv_blocks_total"] == 256 and pool["kv_blocks_free"] == 256 and pool["running"] == 0


@pytest.mark.parametrize(
    "body, code, status",
    [
        ("not json at all", "invalid_json", 400),
        ("[1, 2]", "invalid_json", 400),
        ('{"sdp": "", "type": "offer"}', "bad_offer", 400),
        ('{"sdp": "v=0", "type": "answer"}', "bad_offer", 400),
        ('{"sdp": "v=0\\r\\nm=video 9 UDP 96", "type": "offer"}', "bad_offer", 400),
        ('{"sdp": "garbage m=audio garbage", "type": "offer"}', "bad_offer", 400),
        (
            '{"sdp": "v=0\\r\\nm=audio 9 UDP 111\\r\\n", "type": "offer", "conversation_id": "nope"}',
            "conversation_not_found",
            404,
        ),
        ('{"sdp": "v=0\\r\\nm=audio 9 UDP 111\\r\\n", "type": "offer", "session": {"vad": 3}}', "invalid_event", 400),
        # Values are checked against the config's ranges as the event is parsed, before the SDP.
        (
            '{"sdp": "v=0\\r\\nm=audio 9 UDP 111\\r\\n", "type": "offer", "session": {"vad": {"threshold": 7}}}',
            "invalid_value",
            400,
        ),
    ],
)
async def test_bad_offers_are_4xx_with_a_message(http, body, code, status):
    resp = await http.post("/api/rtc/offer", data=body, headers={"Content-Type": "application/json"})
    await _error(resp, status, code)
    # A refused offer leaves no session behind.
    assert (await (await http.get("/api/status")).json())["sessions"]["active"] == 0


async def test_session_cap_gives_503_with_retry_after(http):
    first = RtcClient(ScriptedMic())
    status, _ = await first.connect(http)
    assert status == 201
    second = RtcClient(ScriptedMic())
    resp = await http.post("/api/rtc/offer", json={"sdp": "v=0\r\nm=audio 9 UDP 111\r\n", "type": "offer"})
    assert "full" in await _error(resp, 503, "server_full")
    assert int(resp.headers["Retry-After"]) > 0
    await first.close()
    await second.close()


async def test_conversation_api(http):
    store = http.app[SERVER_CONTEXT].store
    conv = await store.create_conversation()
    tone = (0.2 * np.sin(np.arange(24000) / 24000 * 2 * np.pi * 200)).astype(np.float32)
    await store.add_turn(conv["id"], "user", audio=np.zeros(8000, np.float32) + 0.1)
    await store.add_turn(conv["id"], "assistant", "Hi there.", audio=tone, interrupted=True)

    listed = await (await http.get("/api/conversations")).json()
    assert [c["id"] for c in listed["conversations"]] == [conv["id"]]
    assert listed["has_more"] is False and listed["next_cursor"] is None
    assert listed["conversations"][0]["title"] == "Hi there." and listed["conversations"][0]["num_turns"] == 2
    detail = await (await http.get(f"/api/conversations/{conv['id']}")).json()
    assert [(t["role"], t["interrupted"]) for t in detail["turns"]] == [("user", False), ("assistant", True)]

    resp = await http.get(f"/api/conversations/{conv['id']}/turns/1/audio")
    assert resp.status == 200 and resp.content_type == "audio/wav"
    pcm, sr = sf.read(io.BytesIO(await resp.read()), dtype="float32")
    assert sr == 24000 and np.max(np.abs(pcm - tone)) < 1e-3
    pcm, sr = sf.read(io.BytesIO(await (await http.get(f"/api/conversations/{conv['id']}/turns/0/audio")).read()))
    assert sr == 16000 and pcm.size == 8000
    await _byte_ranges(http, f"/api/conversations/{conv['id']}/turns/1/audio")

    await _error(await http.get(f"/api/conversations/{conv['id']}/turns/5/audio"), 404, "audio_not_found")
    await _error(await http.get(f"/api/conversations/{conv['id']}/turns/x/audio"), 400, "bad_request")
    await _error(await http.get("/api/conversations/unknown"), 404, "conversation_not_found")
    await _error(await http.get("/api/conversations/..%2F..%2Fetc"), 404, "conversation_not_found")
    await _error(await http.get("/api/conversations?limit=abc"), 400, "bad_request")
    await _error(await http.get("/api/conversations?cursor=abc"), 400, "invalid_value")
    newer = await store.create_conversation()
    await store.add_turn(newer["id"], "user", "A newer one.")
    first = await (await http.get("/api/conversations?limit=1")).json()
    assert [c["id"] for c in first["conversations"]] == [newer["id"]] and first["has_more"] is True
    rest = await (await http.get("/api/conversations", params={"limit": 1, "cursor": first["next_cursor"]})).json()
    assert [c["id"] for c in rest["conversations"]] == [conv["id"]] and rest["has_more"] is False
    assert (await http.delete(f"/api/conversations/{newer['id']}")).status == 200
    await _error(
        await http.get("/api/conversations", params={"q": "a\x00b"}), 400, "invalid_value"
    )  # FTS5 broke on NUL
    await _error(await http.get("/api/nothing-here"), 404, "not_found")

    await store.leases.acquire(conv["id"], "sess_live")  # a live session holds it: not deleted under it
    resp = await http.delete(f"/api/conversations/{conv['id']}")
    await _error(resp, 409, "conversation_busy")
    assert int(resp.headers["Retry-After"]) >= 1
    await store.leases.release(conv["id"], "sess_live")
    assert (await http.delete(f"/api/conversations/{conv['id']}")).status == 200
    await _error(await http.delete(f"/api/conversations/{conv['id']}"), 404, "conversation_not_found")
    assert (await (await http.get("/api/conversations")).json())["conversations"] == []
    other = await store.create_conversation()  # deleted by five at once: one deletes it
    statuses = await asyncio.gather(*[http.delete(f"/api/conversations/{other['id']}") for _ in range(5)])
    assert sorted(r.status for r in statuses) == [200, 404, 404, 404, 404]
