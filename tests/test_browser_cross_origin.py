"""An app's own page calls the server from another origin, in headless Chromium, as OpenAI's
browser examples call OpenAI: the app's backend mints an ephemeral key with the API key, the
page sends its SDP offer to POST /v1/realtime/calls with it (a cross-origin fetch, so a CORS
preflight first), reads the answer and the call id in `Location`, and hears session.created
on its `oai-events` channel; the backend hangs up. A page on an origin not in
`server.allowed_origins` is stopped by the browser before any call is made."""

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kimiaudio.server.context import SERVER_CONTEXT
from kimiaudio.server.middleware.access import API_KEY_ENV

from helpers.browser import BROWSER_MARKS, start_chromium, wait_for_script

pytestmark = BROWSER_MARKS
KEY = "cross-origin-key-7"

# The app's page: OpenAI's WebRTC example (the microphone, a data channel named oai-events, the
# offer once ICE gathering is complete, the answer from /v1/realtime/calls).
PAGE = """<!doctype html><title>app</title><script>
const SERVER = %(server)s, EPHEMERAL_KEY = %(key)s;
window.events = [];
async function call() {
  const mic = await navigator.mediaDevices.getUserMedia({ audio: true });
  const pc = new RTCPeerConnection();
  const channel = pc.createDataChannel("oai-events");
  channel.onmessage = (e) => window.events.push(JSON.parse(e.data).type);
  mic.getTracks().forEach((track) => pc.addTrack(track, mic));
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((done) => {
    if (pc.iceGatheringState === "complete") return done();
    pc.addEventListener("icegatheringstatechange", () => pc.iceGatheringState === "complete" && done());
  });
  const resp = await fetch(`${SERVER}/v1/realtime/calls`, {
    method: "POST",
    body: pc.localDescription.sdp,
    headers: { Authorization: `Bearer ${EPHEMERAL_KEY}`, "Content-Type": "application/sdp" },
  });
  window.answered = { status: resp.status, location: resp.headers.get("Location") };
  await pc.setRemoteDescription({ type: "answer", sdp: await resp.text() });
}
call().catch((e) => { window.failure = String(e); });
</script>"""


@pytest.fixture
async def server(tmp_path, monkeypatch, demo_server):
    """(the server's test client, the page both origins serve (set its "text"), the allowed
    origin's page URL, another origin's)."""
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    page = {"text": ""}

    async def serve_page(_request):
        return web.Response(text=page["text"], content_type="text/html")

    origins = []
    for _ in range(2):
        app = web.Application()
        app.router.add_get("/", serve_page)
        origins.append(TestServer(app))
        await origins[-1].start_server()
    allowed, other = (f"http://localhost:{origin.port}" for origin in origins)
    async with demo_server(tmp_path / "data", api_key=KEY, allowed_origins=[allowed]) as (client, _):
        yield client, page, allowed + "/", other + "/"
    for origin in origins:
        await origin.close()


async def test_an_apps_page_calls_from_its_own_origin(server, tmp_path):
    client, page, allowed_url, other_url = server
    backend = {"Authorization": f"Bearer {KEY}"}
    minted = await client.post("/v1/realtime/client_secrets", json={"session": {"type": "realtime"}}, headers=backend)
    assert minted.status == 200
    text = PAGE % {
        "server": json.dumps(str(client.make_url("")).rstrip("/")),
        "key": json.dumps((await minted.json())["value"]),
    }
    page["text"] = text

    driver = await asyncio.to_thread(start_chromium, tmp_path, None)
    try:

        def call_from(url: str, until: str):
            driver.get(url)
            wait_for_script(driver, until)
            return driver.execute_script("return [window.failure || null, window.answered, window.events]")

        failure, answered, events = await asyncio.to_thread(
            call_from, allowed_url, "return window.failure || window.events.includes('session.created')"
        )
        assert failure is None and answered["status"] == 201, (failure, answered)
        assert answered["location"].startswith("/v1/realtime/calls/rtc_") and events[0] == "session.created"
        call_id = answered["location"].rsplit("/", 1)[-1]
        assert (await client.post(f"/v1/realtime/calls/{call_id}/hangup", headers=backend)).status == 200
        assert len(client.app[SERVER_CONTEXT].sessions) == 0

        refused, answered, _ = await asyncio.to_thread(call_from, other_url, "return window.failure")
        assert "fetch" in refused and answered is None  # the browser's TypeError: the preflight was refused
        assert len(client.app[SERVER_CONTEXT].sessions) == 0
    finally:
        await asyncio.to_thread(driver.quit)
