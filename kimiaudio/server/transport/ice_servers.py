"""The ICE servers handed to WebRTC peers: the page's (in /api/status) and the server's own.

STUN URLs go as they are. TURN URLs get time-limited credentials when `[server] turn_secret`
(or KIMIAUDIO_TURN_SECRET) is set, in the scheme of coturn's shared-secret authentication
(use-auth-secret; the "TURN REST API" draft): username "<unix expiry>:kimiaudio", credential
base64(HMAC-SHA1(secret, username)). The TURN server checks them with the same secret, so the
secret never reaches a browser, and a credential copied from the page expires.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

from kimiaudio.config import Config

TURN_SECRET_ENV = "KIMIAUDIO_TURN_SECRET"
TURN_USER = "kimiaudio"


def turn_secret(config: Config) -> str:
    return os.environ.get(TURN_SECRET_ENV) or config.server.turn_secret


def turn_credentials(secret: str, expires_at: float) -> tuple[str, str]:
    """(username, credential) valid until `expires_at` (unix seconds) for a TURN server
    sharing `secret`."""
    username = f"{int(expires_at)}:{TURN_USER}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode()


def ice_servers(config: Config, now: float) -> list[dict]:
    """RTCIceServer dictionaries ({"urls", and for TURN "username", "credential"}) as of `now`."""
    secret = turn_secret(config)
    servers = []
    for url in config.server.ice_servers:
        server = {"urls": url}
        if secret and url.startswith("turn"):
            server["username"], server["credential"] = turn_credentials(
                secret, now + config.server.turn_credential_ttl_s
            )
        servers.append(server)
    return servers
