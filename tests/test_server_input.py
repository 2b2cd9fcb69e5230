"""Every HTTP entry point refuses bad input where it enters: a 4xx with a plain JSON message,
never a 500, a traceback, an internal exception's name or an ERROR log line. The named cases
of the probe run (deep nesting, 2^63 turn indices, offers without a DTLS fingerprint,
text/plain JSON, oversized bodies) and, as a property, a sweep of hostile values over every
route the app has, today's and any added later."""

import json
import logging
import re

import pytest

from kimiaudio.server.context import SERVER_CONTEXT

from helpers.hostile_clients import INTERNAL_NAMES, offer_sdp, route_templates

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
async def http(demo_server):
    async with demo_server(max_sessions=2) as (client, _):
        yield client


@pytest.fixture
async def sdp():
    return await offer_sdp()


async def refused(resp, status=None, code=None) -> str:
    """The error's message, after checking it is a plain JSON 4xx."""
    text = await resp.text()
    assert 400 <= resp.status < 500 and (status is None or resp.status == status), (resp.status, text)
    error = json.loads(text)["error"]
    assert code is None or error["code"] == code, error
    assert error["message"] and not INTERNAL_NAMES.search(error["message"]), error
    return error["message"]


def post_json(http, path, body, content_type="application/json"):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return http.post(path, data=data, headers={"Content-Type": content_type})


@pytest.mark.parametrize(
    "body",
    ["[" * 50000, '{"a": ' * 10000, '{"sdp": "v=0", "type": "offer", "session": ' + '{"vad": ' * 40 + "{}" + "}" * 41],
)
async def test_deeply_nested_json_is_refused(http, body):
    await refused(await post_json(http, "/api/rtc/offer", body), 400, "invalid_json")


@pytest.mark.parametrize(
    "index", ["9223372036854775808", str(2**64), str(10**30), "-1", "+1", "1_0", "1e3", "\u0661", str(2**31)]
)
async def test_out_of_range_turn_indices_are_refused(http, index):
    conversation = await http.app[SERVER_CONTEXT].store.create_conversation()
    await refused(await http.get(f"/api/conversations/{conversation['id']}/turns/{index}/audio"), 400, "bad_request")


@pytest.mark.parametrize("limit", [str(2**64), "-5", "0", "1001", "abc", "1.5"])
async def test_out_of_range_query_values_are_refused(http, limit):
    await refused(await http.get(f"/api/conversations?limit={limit}"), 400, "bad_request")


def _without(sdp: str, prefix: str) -> str:
    return "".join(line for line in sdp.splitlines(keepends=True) if not line.startswith(prefix))


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda s: _without(s, "a=fingerprint"), "fingerprint"),
        (lambda s: re.sub(r"a=fingerprint:sha-256 \S+", "a=fingerprint:sha-256 zz", s), "fingerprint"),
        (lambda s: re.sub(r"a=fingerprint:sha-256", "a=fingerprint:md5", s), "fingerprint"),
        (lambda s: _without(s, "a=ice-ufrag"), "ice-ufrag"),
        (lambda s: _without(s, "a=rtcp-mux"), "rtcp-mux"),
        (lambda s: re.sub(r"m=audio (\d+) (\S+) ", r"m=audio \1 \2 300 ", s), "parsed"),  # payload type > 255
        (lambda s: re.sub(r"m=audio \d+", "m=audio 99999999", s), "port"),
        (lambda s: re.sub(r"m=audio \d+ \S+", "m=audio x", s), "parsed"),
        (lambda s: re.sub(r"(a=candidate:\S+ \d+ \S+ \d+ \S+ )\d+", r"\g<1>700000", s), "candidate"),
        (lambda s: s.replace("a=rtpmap:", "a=rtpmap:x "), "parsed"),
        (lambda s: s.replace("m=audio", "m=video"), "audio"),
        (lambda s: s.replace("a=sendrecv", "a=recvonly"), "recvonly"),  # (listening only: no microphone)
        (lambda s: s + "a=x:" + "y" * 70000 + "\r\n", "too large"),
        (lambda s: s.replace("s=-", "s=\x01"), "control"),
        (lambda s: "x" + s, "v=0"),
        (lambda s: _without(s, "a=mid:0"), "a=mid"),  # (aiortc pairs the transports by it)
        (lambda s: s.replace("a=mid:1", "a=mid:0"), "a=mid"),
        (lambda s: s.replace("a=extmap:1 ", "a=extmap:99999 "), "extmap"),  # (packed into every RTP packet)
        (lambda s: re.sub(r"a=sctp-port:\d+", "a=sctp-port:99999", s), "SCTP port"),  # (the data channel's)
        (lambda s: _without(s, "a=sctp-port"), "sctp-port"),
        (lambda s: s.replace("UDP/DTLS/SCTP webrtc-datachannel", "DTLS/SCTP 99999"), "SCTP port"),
        (lambda s: re.sub(r"a=max-message-size:\d+", "a=max-message-size:-5", s), "max-message-size"),
        (lambda s: re.sub(r"a=max-message-size:\d+", "a=max-message-size:100", s), "too small"),
    ],
)
async def test_bad_sdp_is_refused_before_aiortc(http, sdp, change, words):
    message = await refused(await post_json(http, "/api/rtc/offer", {"sdp": change(sdp), "type": "offer"}), 400)
    assert words in message, message
    assert (await (await http.get("/api/status")).json())["sessions"]["active"] == 0


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.999])
async def test_a_truncated_offer_is_refused_with_a_message(http, sdp, fraction):
    """A real aiortc offer cut short (the probe suite cuts at 90% and 98%): whatever it lost (the
    DTLS fingerprint, half a candidate, the end of a line) it is a 400 saying why, never a 500."""
    cut = sdp[: int(len(sdp) * fraction)]
    resp = await post_json(http, "/api/rtc/offer", {"sdp": cut, "type": "offer"})
    if resp.status != 200:  # what was cut may leave a usable offer (a trailing attribute): then it works
        message = await refused(resp, 400, "bad_offer")
        assert len(message) > 10, message
    else:
        await (await http.get("/api/status")).json()


async def test_session_values_are_checked_with_the_offer(http, sdp):
    resp = await post_json(http, "/api/rtc/offer", {"sdp": sdp, "type": "offer", "session": {"vad": {"threshold": 7}}})
    assert "vad.threshold" in await refused(resp, 400, "invalid_value")
    assert (await (await http.get("/api/status")).json())["sessions"]["active"] == 0


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "application/jsonx", ""]
)
async def test_json_endpoints_require_application_json(http, sdp, content_type):
    resp = await post_json(http, "/api/rtc/offer", {"sdp": sdp, "type": "offer"}, content_type)
    assert "application/json" in await refused(resp, 415, "unsupported_media_type")


async def test_oversized_bodies_are_refused(http, sdp):
    await refused(
        await post_json(http, "/api/rtc/offer", {"sdp": sdp, "type": "offer", "pad": "x" * 200_000}), 413, "too_large"
    )
    # The app-wide limit holds for any route, before the body is read.
    resp = await http.post(
        "/api/rtc/offer", data=b"{}", headers={"Content-Type": "application/json", "Content-Length": str(2**40)}
    )
    await refused(resp, 413, "too_large")


HOSTILE_VALUES = [
    "9223372036854775808",
    str(2**64),
    "1" + "0" * 30,
    "-1",
    "%00",
    "..%2F..%2Fetc%2Fpasswd",
    "%ff%fe",
    "x" * 3000,
    "%F0%9F%98%80",
    "1e3",
    "null",
    "' OR 1=1 --",
    "\u0661",
    "%0d%0aX: y",
]
HOSTILE_BODIES = [
    (b"[" * 50000, "application/json"),
    (b'{"a": ' * 50000, "application/json"),
    (b"1" * 5000, "application/json"),
    (b'{"x": NaN}', "application/json"),
    (b'{"x": 1e400}', "application/json"),
    (b'"\\ud800"', "application/json"),
    (b"\xff\xfe{}", "application/json"),
    (b"", "application/json"),
    (b"{", "application/json"),
    (b"[]", "application/json"),
    (b"null", "application/json"),
    (json.dumps({"sdp": 5, "type": "offer", "conversation_id": 2**64}).encode(), "application/json"),
    (
        json.dumps({"sdp": "v=0\r\nm=audio 1 UDP 1\r\n", "type": "offer", "conversation_id": ["x"]}).encode(),
        "application/json",
    ),
    (
        json.dumps(
            {
                "sdp": "v=0\r\nm=audio 1 UDP 1\r\n",
                "type": "offer",
                "session": {"sampling": {"seed": 2**64}, "vad": {"silence_ms": 10**30}},
            }
        ).encode(),
        "application/json",
    ),
    (b'{"sdp": "v=0", "type": "offer"}', "text/plain"),
    (b"--x\r\n\r\n", "multipart/form-data; boundary=x"),
]


async def test_every_route_refuses_hostile_input(http, caplog):
    conversation = await http.app[SERVER_CONTEXT].store.create_conversation()
    caplog.set_level(logging.WARNING)
    routes = route_templates(http.app)
    assert len(routes) >= 8, routes
    checked = 0
    for method, template in routes:
        names = re.findall(r"{(\w+)}", template)
        paths = {template.format(**{n: conversation["id"] if n == "id" else "0" for n in names})}
        for name in names:
            paths |= {
                template.format(
                    **{n: (value if n == name else conversation["id"] if n == "id" else "0") for n in names}
                )
                for value in HOSTILE_VALUES
            }
        paths |= {f"{p}?limit={v}&api_key={v}" for p in list(paths)[:1] for v in HOSTILE_VALUES}
        for path in sorted(paths):
            if method == "DELETE" and names == ["id"] and path == template.format(id=conversation["id"]):
                continue  # the one real conversation stays, so every hostile id is tried against a live store
            bodies = HOSTILE_BODIES if method in ("POST", "PUT", "PATCH") else [(b"", None)]
            for body, content_type in bodies:
                headers = {"Content-Type": content_type} if content_type else {}
                resp = await http.request(method, path, data=body, headers=headers, skip_auto_headers=["Content-Type"])
                text = await resp.text()
                assert resp.status < 500, (method, path, body[:80], resp.status, text)
                if resp.status >= 400 and resp.content_type == "application/json":
                    assert not INTERNAL_NAMES.search(json.loads(text)["error"]["message"]), (method, path, text)
                checked += 1
    assert checked > 300
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert (await (await http.get("/api/status")).json())["sessions"]["active"] == 0
