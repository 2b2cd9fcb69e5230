"""Who may use the server: the Host allow-list, the optional API key, and the Origin check.

One middleware, applied to every route (today's and any added later):
1. Host: the Host header must name this server (`server.allowed_hosts`; by default the bound
   host, localhost, 127.0.0.1, [::1]). A DNS-rebinding page reaches 127.0.0.1 under its own
   name, so its requests carry that name: 421, before anything else is looked at.
2. API key (`server.api_key`, or KIMIAUDIO_API_KEY): required by every route but the demo page,
   `/api/auth` (which only says whether a key is needed) and the page's sign-in and sign-out.
   Accepted as `Authorization: Bearer KEY`; for what a browser cannot give headers to, as
   `?api_key=KEY` or the WebSocket subprotocol `openai-insecure-api-key.KEY` (the OpenAI
   Realtime browser convention). Compared in constant time; 401 otherwise. Keys the server
   issued grant less (issued_keys.py): an ephemeral `ek_` key opens a Realtime session or
   call only (checked with or without an API key: its session configuration comes with it),
   the page's sign-in cookie the page's routes under /api/, for requests from the page itself.
3. Origin: a state-changing request (any method but GET/HEAD/OPTIONS, and WebSocket upgrades)
   that carries an Origin header must come from the server's own page or an allowed origin
   (`server.allowed_origins`): 403 otherwise. Scripts and curl send no Origin and pass. What a
   browser on an allowed origin may read of the answers: cors.py.
A client that presents too many wrong keys has every key refused for a while (key_guesses.py).
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from yarl import URL

from kimiaudio.config import Config
from kimiaudio.errors import ConfigError
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.inputs.client_address import Network, client_address, trusted_networks
from kimiaudio.server.middleware import issued_keys
from kimiaudio.server.middleware.key_guesses import KeyGuesses

API_KEY_ENV = "KIMIAUDIO_API_KEY"
WS_KEY_PREFIX = "openai-insecure-api-key."
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@dataclass(frozen=True)
class AccessPolicy:
    api_key: str  # "" = none
    allowed_hosts: frozenset[str] | None  # lower-case host names; None = any
    allowed_origins: frozenset[str]  # normalised scheme://host:port
    trusted_proxies: tuple[Network, ...] = ()  # whose X-Forwarded-For names the client

    @classmethod
    def from_config(cls, config: Config) -> AccessPolicy:
        server = config.server
        hosts = [_host_name(h) for h in server.allowed_hosts] or [_host_name(server.host), *LOOPBACK_HOSTS]
        allowed_hosts = None if "*" in hosts else frozenset(h for h in hosts if h)
        origins = frozenset(_origin(o) for o in server.allowed_origins)
        api_key = os.environ.get(API_KEY_ENV) or server.api_key
        if api_key and not _is_token(api_key):
            raise ConfigError(
                f"{API_KEY_ENV if os.environ.get(API_KEY_ENV) else 'server.api_key'}: expected printable "
                "ASCII without spaces (it travels in an HTTP header)"
            )
        return cls(api_key, allowed_hosts, origins, trusted_networks(server.trusted_proxies))

    def allows_origin(self, origin: str) -> bool:
        """`origin` (an Origin header) is one of `server.allowed_origins`."""
        return _origin(origin) in self.allowed_origins


def _is_token(key: str) -> bool:
    return key.isascii() and key.isprintable() and " " not in key


def _host_name(host: str) -> str:
    """'Example.org:8080' -> 'example.org'; '[::1]:80' -> '::1'; '0.0.0.0' names no host."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":")[0]
    return "" if host in ("0.0.0.0", "::") else host


def _origin(value: str) -> str:
    """'HTTP://Example.org' -> 'http://example.org:80'; anything else ("null") as written."""
    try:
        url = URL(value.strip())
        if url.scheme and url.host:
            return f"{url.scheme.lower()}://{url.host.lower()}:{url.port or _DEFAULT_PORTS.get(url.scheme, 0)}"
    except ValueError:
        pass
    return value.strip().lower()


def exposure_warning(config: Config, policy: AccessPolicy) -> str | None:
    """What to print when the server listens beyond this machine without a key."""
    if policy.api_key or config.server.host in LOOPBACK_HOSTS:
        return None
    return (
        f"warning: listening on {config.server.host} without an API key: anyone who can reach the port can "
        "talk to the model and list, play and delete every conversation. Set server.api_key "
        f"(or {API_KEY_ENV})."
    )


MIN_KEY_CHARS = 16
_URL_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def key_warning(policy: AccessPolicy) -> str | None:
    """What to print about an API key that is easy to guess, or that some clients cannot send:
    a browser's WebSocket subprotocol takes no `/ = , ;` and a query string reads `+` as a space."""
    key = policy.api_key
    if not key:
        return None
    problems = []
    if len(key) < MIN_KEY_CHARS:
        problems.append(
            f"it is {len(key)} characters long (guesses from many addresses may find it; use {MIN_KEY_CHARS} or more)"
        )
    awkward = sorted(set(key) - _URL_SAFE)
    if awkward:
        problems.append(
            f"it holds {' '.join(awkward)}, which a browser cannot send as a WebSocket subprotocol "
            "nor, for +, in ?api_key="
        )
    if not problems:
        return None
    return (
        f"warning: the API key ({API_KEY_ENV} or server.api_key): {'; '.join(problems)}. "
        "A key from `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'` has neither problem."
    )


PUBLIC_PATHS = ("/", "/api/auth", "/api/signin", "/api/signout")


def _is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith("/static/")


def _presented_key(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    for protocol in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
        if protocol.strip().startswith(WS_KEY_PREFIX):
            return protocol.strip()[len(WS_KEY_PREFIX) :]
    return request.query.get("api_key")


def key_matches(presented: str | None, expected: str) -> bool:
    # compare_digest takes its time from the presented key's length only, never from the contents.
    return presented is not None and hmac.compare_digest(
        presented.encode("utf-8", "surrogateescape"), expected.encode("ascii")
    )


def _same_origin(request: web.Request, origin: str) -> bool:
    """The page this server served (scheme://Host) sent it."""
    host = request.headers.get("Host")
    return host is not None and origin == _origin(f"{request.scheme}://{host}")


def _from_the_page(request: web.Request) -> bool:
    """The request may be the page's own: no Origin (a same-origin GET), or the server's. The
    sign-in cookie is the page's: a browser sends its SameSite=Strict cookie with requests from
    any origin of the same site too (another port, a sibling subdomain), and an allowed origin's
    page must not act with the page's authority (it brings a key of its own)."""
    origin = request.headers.get("Origin")
    return origin is None or _same_origin(request, _origin(origin))


def access_middleware(policy: AccessPolicy, store: issued_keys.Store, guesses: KeyGuesses) -> Middleware:
    """The middleware that holds every request to `policy` (Host, API key, Origin); `store`
    gives the conversation store, where the keys the server issued are; `guesses` counts the
    wrong keys."""

    @web.middleware
    async def check_access(request: web.Request, handler: Handler) -> web.StreamResponse:
        _check_host(policy, request)
        await _check_key(policy, store, guesses, request)
        _check_origin(policy, request)
        return await handler(request)

    return check_access


def _check_host(policy: AccessPolicy, request: web.Request) -> None:
    host = request.headers.get("Host")
    if host is not None and policy.allowed_hosts is not None and _host_name(host) not in policy.allowed_hosts:
        raise ApiError(
            421,
            "unknown_host",
            f"this server does not answer to the host {host[:100]!r} (add it to server.allowed_hosts)",
        )


async def _check_key(policy: AccessPolicy, store: issued_keys.Store, guesses: KeyGuesses, request: web.Request) -> None:
    presented = _presented_key(request)
    # Who sent it matters only for a key (most requests of the page carry none: no lookup).
    client = client_address(request, policy.trusted_proxies) if presented is not None else None
    if presented is not None:
        guesses.check(client)
    if policy.api_key and key_matches(presented, policy.api_key):
        return
    if issued_keys.is_ephemeral(presented) and issued_keys.opens_realtime(request):
        try:
            await issued_keys.check_ephemeral(store, request, presented or "", policy.api_key)
        except issued_keys.UnknownKey:
            guesses.wrong(client)
            raise
        return
    if not policy.api_key or _is_public(request.path):
        return
    if issued_keys.is_ephemeral(presented):
        raise issued_keys.out_of_scope()
    if request.path.startswith("/api/") and _from_the_page(request):
        if await issued_keys.signed_in(store, request, policy.api_key):
            return
    if presented is not None:
        guesses.wrong(client)
    raise ApiError(
        401,
        "unauthorized",
        "this server needs an API key: send Authorization: Bearer <key>",
        headers={"WWW-Authenticate": "Bearer"},
    )


def _check_origin(policy: AccessPolicy, request: web.Request) -> None:
    origin = request.headers.get("Origin")
    changes_state = request.method not in _SAFE_METHODS or request.headers.get("Upgrade", "").lower() == "websocket"
    if origin is not None and changes_state:
        if not policy.allows_origin(origin) and not _same_origin(request, _origin(origin)):
            raise ApiError(
                403,
                "forbidden_origin",
                f"requests from the origin {origin[:100]!r} are not allowed (add it to server.allowed_origins)",
            )
