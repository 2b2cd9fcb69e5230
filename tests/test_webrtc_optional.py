"""A server without aiortc (the GPU machine carries no aiortc wheels, .ci/gpu-wheels) starts and
serves: the WebRTC offer, calls and sideband answer 503 naming what is missing, the other routes
serve. Run in a subprocess whose imports of aiortc fail, so this process's modules stay as they
are."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, logging, sys
    sys.modules["aiortc"] = None  # `import aiortc` raises ImportError, as where it is not installed
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from aiohttp.test_utils import TestClient, TestServer
    from kimiaudio.config import load_config
    from kimiaudio.pipeline.model_stack import ModelStack
    from kimiaudio.server.app import create_app

    async def main():
        config = load_config(None, {"model": {"device": "cpu"}, "storage": {"data_dir": sys.argv[1]}})
        app = create_app(config, ModelStack.load(config))  # the demo checkpoint, as `serve` starts
        async with TestClient(TestServer(app)) as client:
            offer = await client.post("/api/rtc/offer", json={"sdp": "v=0", "type": "offer"})
            call = await client.post("/v1/realtime/calls", data="v=0", headers={"Content-Type": "application/sdp"})
            hangup = await client.post("/v1/realtime/calls/rtc_x/hangup")
            side = await client.get("/v1/realtime?call_id=rtc_x")
            status = await client.get("/api/status")
            print(json.dumps({
                "offer": [offer.status, await offer.json()],
                "call": [call.status, await call.json()],
                "hangup": hangup.status,
                "side": side.status,
                "status": status.status,
            }))

    asyncio.run(main())
    """
)


def test_without_aiortc_the_offer_is_503_and_the_rest_serves(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for route in ("offer", "call"):
        status, body = got[route]
        assert status == 503 and body["error"]["code"] == "webrtc_unavailable"
        assert "aiortc is not installed" in body["error"]["message"] and "/v1/realtime" in body["error"]["message"]
    assert got["hangup"] == 503 and got["side"] == 503  # (a sideband joins a WebRTC call)
    assert got["status"] == 200
    assert "WebRTC is off: aiortc is not installed" in done.stderr
