"""ICE servers for WebRTC peers (server/transport/ice_servers.py): STUN URLs as they are, TURN
URLs with coturn-style time-limited credentials derived from [server] turn_secret."""

from __future__ import annotations

import time

import pytest
from aiortc import RTCConfiguration, RTCIceServer

from kimiaudio.config import load_config
from kimiaudio.errors import ConfigError
from kimiaudio.server.transport.ice_servers import TURN_SECRET_ENV, ice_servers, turn_credentials

URLS = ["stun:stun.example.org:3478", "turn:turn.example.org:3478?transport=udp", "turns:turn.example.org:443"]


def test_credentials_are_coturns_hmac_of_the_username():
    # The reference value: echo -n 1700086400:kimiaudio | openssl dgst -sha1 -hmac north-secret -binary | base64
    assert turn_credentials("north-secret", 1700086400.7) == ("1700086400:kimiaudio", "cfqqVFG6xRNh2DCwWcHIe8Jedpw=")


def test_turn_urls_get_credentials_stun_urls_do_not(monkeypatch):
    monkeypatch.delenv(TURN_SECRET_ENV, raising=False)
    config = load_config(None, {"server": {"ice_servers": URLS, "turn_credential_ttl_s": 600}})
    assert ice_servers(config, 1000.0) == [{"urls": url} for url in URLS]  # no secret: URLs only
    config.server.turn_secret = "from-the-file"
    stun, turn, turns = ice_servers(config, 1000.0)
    assert stun == {"urls": URLS[0]}
    assert turn["username"] == turns["username"] == "1600:kimiaudio"  # expires ttl after now
    assert turn["credential"] == turn_credentials("from-the-file", 1600)[1]
    monkeypatch.setenv(TURN_SECRET_ENV, "from-the-environment")  # wins over the file
    assert ice_servers(config, 1000.0)[1]["credential"] == turn_credentials("from-the-environment", 1600)[1]
    # What the server-side peer is configured with.
    configuration = RTCConfiguration(iceServers=[RTCIceServer(**server) for server in ice_servers(config, 1000.0)])
    assert [(s.urls, s.username) for s in configuration.iceServers] == [
        (URLS[0], None),
        (URLS[1], "1600:kimiaudio"),
        (URLS[2], "1600:kimiaudio"),
    ]


@pytest.mark.parametrize("ttl", [59, 30 * 86400 + 1])
def test_credential_lifetime_out_of_range_is_refused(ttl):
    with pytest.raises(ConfigError, match="turn_credential_ttl_s"):
        load_config(None, {"server": {"turn_credential_ttl_s": ttl}})


async def test_the_page_gets_fresh_credentials_never_the_secret(monkeypatch, demo_server):
    monkeypatch.delenv(TURN_SECRET_ENV, raising=False)
    async with demo_server(ice_servers=URLS[:2], turn_secret="s3cret-value") as (http, _):
        before = time.time()
        body = await (await http.get("/api/status")).json()
        stun, turn = body["ice_servers"]
        assert stun == {"urls": URLS[0]} and turn["urls"] == URLS[1]
        expiry = int(turn["username"].split(":")[0])
        assert before + 86400 - 1 <= expiry <= time.time() + 86400
        assert turn["credential"] == turn_credentials("s3cret-value", expiry)[1]
        assert "s3cret-value" not in await (await http.get("/api/status")).text()
