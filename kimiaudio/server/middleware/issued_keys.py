"""What a key the server issued grants (the keys are in the shared store: store/access_keys.py).

- An ephemeral Realtime key (`ek_...`, POST /v1/realtime/client_secrets, minted with the API
  key): opens a Realtime session (GET /v1/realtime) or a call (POST /v1/realtime/calls),
  any number of them until it expires, and nothing else; the session configuration bound to
  it is put on the request (`BOUND_SESSION`) for the route to apply before the client's own.
  An unknown or expired one is 401 `invalid_api_key`, even on a server without an API key
  (a client then learns its key expired instead of getting a session without its settings).
- The page's sign-in (the cookie `signin_cookie` names, set by POST /api/signin for the API key
  typed once): the page's own routes under /api/, so that the page never keeps the API key.
  Browsers send a host's cookies to every port of it, so the name carries the port the browser
  addressed: two servers on one host keep their sign-ins apart, and the instances of a fleet
  behind one front (one address, one port) share theirs.
A session a key opened may outlive the key, as OpenAI's do. Both kinds are minted under the
server's API key (store/access_keys.py: `issuer`): a new API key voids them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from kimiaudio.server.api_error import ApiError
from kimiaudio.store import ConversationStore
from kimiaudio.store.access_keys import find_key

EPHEMERAL_PREFIX = "ek_"
EPHEMERAL_SCOPE = "realtime"
PAGE_SCOPE = "page"
SIGNIN_COOKIE = "kimiaudio_signin"  # signin_cookie adds the port
# Where an ephemeral key is accepted: (method, path) of opening a Realtime session or call.
EPHEMERAL_ROUTES = (("GET", "/v1/realtime"), ("POST", "/v1/realtime"), ("POST", "/v1/realtime/calls"))
BOUND_SESSION = web.RequestKey("bound_session", dict)  # the session configuration of the key used

Store = Callable[[], ConversationStore]


def is_ephemeral(key: str | None) -> bool:
    return key is not None and key.startswith(EPHEMERAL_PREFIX)


def opens_realtime(request: web.Request) -> bool:
    """A request an ephemeral key may make: opening a session or a call, not joining a call's
    session from the side (`?call_id=`: the server's own connection, as OpenAI has it)."""
    return (request.method, request.path.rstrip("/")) in EPHEMERAL_ROUTES and "call_id" not in request.query


def invalid_key(message: str) -> ApiError:
    return ApiError(401, "invalid_api_key", message, headers={"WWW-Authenticate": "Bearer"})


class UnknownKey(ApiError):
    """An ephemeral key this server never issued (under its API key now): a guess, where an
    expired one is not (key_guesses.py)."""

    def __init__(self) -> None:
        super().__init__(
            401,
            "invalid_api_key",
            "this ephemeral key is not valid (mint one with POST /v1/realtime/client_secrets)",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def check_ephemeral(store: Store, request: web.Request, key: str, issuer: str) -> None:
    """An ephemeral key presented to open a session or call: valid (minted under `issuer`, the
    server's API key now), or 401 (UnknownKey for one never issued); its bound session goes on
    the request."""
    record = await find_key(store(), key, issuer)
    if record is None or record.scope != EPHEMERAL_SCOPE:
        raise UnknownKey()
    if record.expired(store().clock()):
        raise invalid_key("this ephemeral key has expired (mint a new one with POST /v1/realtime/client_secrets)")
    if record.session is not None:
        request[BOUND_SESSION] = record.session


def out_of_scope() -> ApiError:
    return invalid_key(
        "an ephemeral key (ek_...) only opens a Realtime session (GET /v1/realtime) or call "
        "(POST /v1/realtime/calls); this route needs the server's API key"
    )


def signin_cookie(request: web.Request) -> str:
    """The name of the page's sign-in cookie for the server the browser addressed (its Host's
    port, or the scheme's)."""
    try:
        port = request.url.port
    except ValueError:  # a Host header yarl cannot read: no port to tell servers apart by
        port = None
    return SIGNIN_COOKIE if port is None else f"{SIGNIN_COOKIE}_{port}"


async def signed_in(store: Store, request: web.Request, issuer: str) -> bool:
    """The request carries the cookie of an unexpired page sign-in, made with `issuer` (the
    server's API key now)."""
    key = request.cookies.get(signin_cookie(request))
    if not key:
        return False
    record = await find_key(store(), key, issuer)
    return record is not None and record.scope == PAGE_SCOPE and not record.expired(store().clock())


def bound_session(request: web.Request) -> dict[str, Any] | None:
    """The session configuration of the ephemeral key that opened this request's session, if any."""
    return request.get(BOUND_SESSION)
