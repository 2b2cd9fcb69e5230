"""Ephemeral Realtime keys (OpenAI's client secrets): what an app's backend hands its browser.

`create_client_secret(context, body)` is POST /v1/realtime/client_secrets (called with the
server's API key) and the page's own POST /api/client_secrets (its sign-in; routes/signin.py);
`create_beta_session` is the beta API's POST /v1/realtime/sessions
(`client.beta.realtime.sessions.create`): its body is the session itself (beta shape), its
answer the beta session object with `client_secret: {value, expires_at}`, the key living
as its `client_secret.expires_after` says, else BETA_TTL_S (OpenAI's beta keys: one minute);
`create_beta_transcription_session`, its POST /v1/realtime/transcription_sessions
(`client.beta.realtime.transcription_sessions.create`), the same for a transcription session,
whose key lives as its `client_secret.expires_at` says (the SDK's name there). For client_secrets:
the body is OpenAI's `{expires_after?: {anchor: "created_at", seconds: 10..7200}, session?}`
(600 s when not given, as OpenAI's), the session a GA realtime session object, checked now as
a session.update is, against this server (its voices, whether it speaks), so that a bad one is
a 400 here rather than an error when the key is used. The answer is OpenAI's
`{value: "ek_...", expires_at, session}`. The key is stored in the shared database
(store/access_keys.py), by its hash, with the session; middleware/issued_keys.py checks it
where it is presented, and the route opening the session applies the bound session before
the client's own (`bound_update`), as OpenAI applies it: "these can also be overridden by the
client connection". A key opens any number of sessions until it expires; a session it opened
may last longer.
"""

from __future__ import annotations

import secrets
from typing import Any

from aiohttp import web

from kimiaudio.errors import KimiAudioError
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import ServerContext
from kimiaudio.server.inputs.openai_params import Fields, check_model
from kimiaudio.server.inputs.realtime_params import (
    BETA_CLIENT_SECRET_FIELDS,
    BETA_SESSION_CLIENT_SECRET_FIELDS,
    BETA_TRANSCRIPTION_SESSION_FIELDS,
    CLIENT_SECRET_FIELDS,
    EXPIRES_AFTER_FIELDS,
)
from kimiaudio.server.middleware.issued_keys import EPHEMERAL_PREFIX, EPHEMERAL_SCOPE, bound_session
from kimiaudio.server.session.event_fields import ProtocolError
from kimiaudio.server.session.session_objects import beta_session, ga_session
from kimiaudio.server.session.session_settings import SessionSettings
from kimiaudio.server.session.session_update import SessionUpdate, parse_session_update
from kimiaudio.store.access_keys import mint_key

DEFAULT_TTL_S = 600  # OpenAI's, when expires_after is not given
BETA_TTL_S = 60
MIN_TTL_S, MAX_TTL_S = 10, 7200
MAX_BODY_BYTES = 256 * 1024  # long instructions fit; a session is no upload


def _bad(code: str, message: str, param: str | None) -> ApiError:
    return ApiError(400, code, message, param=param)


async def create_client_secret(context: ServerContext, body: dict[str, Any]) -> dict[str, Any]:
    """Mint an ephemeral key for `body` (the module docstring) -> OpenAI's answer."""
    CLIENT_SECRET_FIELDS.check(body)
    ttl_s = _ttl(body.get("expires_after"))
    session = body.get("session")
    settings = await _checked_settings(context, session)
    key, record = await mint_key(
        context.store, EPHEMERAL_PREFIX, EPHEMERAL_SCOPE, ttl_s, session, issuer=context.access.api_key
    )
    expires_at = int(record.expires_at)
    described = ga_session(settings, f"sess_{secrets.token_hex(8)}", None)
    return {"value": key, "expires_at": expires_at, "session": {**described, "expires_at": expires_at}}


async def create_beta_session(context: ServerContext, body: dict[str, Any]) -> dict[str, Any]:
    """Mint an ephemeral key bound to the beta session `body` -> the beta API's answer."""
    ttl_s = _beta_ttl(body, BETA_SESSION_CLIENT_SECRET_FIELDS, "expires_after")
    session = {k: v for k, v in body.items() if k != "client_secret"}
    settings = await _body_settings(context, session)
    key, record = await mint_key(
        context.store, EPHEMERAL_PREFIX, EPHEMERAL_SCOPE, ttl_s, session, issuer=context.access.api_key
    )
    described = beta_session(settings, f"sess_{secrets.token_hex(8)}", None)
    return {**described, "client_secret": {"value": key, "expires_at": int(record.expires_at)}}


async def create_beta_transcription_session(context: ServerContext, body: dict[str, Any]) -> dict[str, Any]:
    """Mint an ephemeral key bound to the beta transcription session `body` -> its answer."""
    BETA_TRANSCRIPTION_SESSION_FIELDS.check(body)
    ttl_s = _beta_ttl(body, BETA_CLIENT_SECRET_FIELDS, "expires_at")
    session = {**{k: v for k, v in body.items() if k != "client_secret"}, "type": "transcription"}
    settings = await _body_settings(context, session)
    key, record = await mint_key(
        context.store, EPHEMERAL_PREFIX, EPHEMERAL_SCOPE, ttl_s, session, issuer=context.access.api_key
    )
    described = beta_session(settings, f"sess_{secrets.token_hex(8)}", None)
    return {**described, "client_secret": {"value": key, "expires_at": int(record.expires_at)}}


def _beta_ttl(body: dict[str, Any], fields: Fields, name: str) -> int:
    """A beta route's key lifetime: its body's `client_secret: {<name>: {anchor, seconds}}`
    (`fields` says what the client_secret may hold), else BETA_TTL_S."""
    secret = body.get("client_secret")
    if secret is not None and not isinstance(secret, dict):
        raise _bad("invalid_type", f"client_secret: expected {{{name}: {{anchor, seconds}}}}", "client_secret")
    fields.check(secret or {}, "client_secret.")
    return _ttl((secret or {}).get(name), f"client_secret.{name}", BETA_TTL_S)


def _ttl(expires_after: Any, where: str = "expires_after", default: int = DEFAULT_TTL_S) -> int:
    if expires_after is None:
        return default
    if not isinstance(expires_after, dict):
        raise _bad("invalid_type", f"{where}: expected {{anchor, seconds}}", where)
    EXPIRES_AFTER_FIELDS.check(expires_after, f"{where}.")
    anchor = expires_after.get("anchor", "created_at")
    if anchor != "created_at":
        message = f"{where}.anchor: expected 'created_at', got {anchor!r}"[:200]
        raise _bad("invalid_value", message, f"{where}.anchor")
    seconds = expires_after.get("seconds", default)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not MIN_TTL_S <= seconds <= MAX_TTL_S:
        raise _bad(
            "invalid_value",
            f"{where}.seconds: expected an integer from {MIN_TTL_S} to {MAX_TTL_S}, got {seconds!r}"[:200],
            f"{where}.seconds",
        )
    return seconds


async def _body_settings(context: ServerContext, body: dict[str, Any]) -> SessionSettings:
    """_checked_settings of a beta route's body, which is the session itself: an error names the
    body's field (`include`), not a `session` the request does not have."""
    try:
        return await _checked_settings(context, body)
    except ApiError as exc:
        named = exc.param or ""
        if not named.startswith("session."):
            raise
        param = named.removeprefix("session.")
        raise ApiError(exc.status_code, exc.code, exc.message.replace(named, param), param=param) from None


async def _checked_settings(context: ServerContext, session: Any) -> SessionSettings:
    """The settings a session opened with this configuration starts with (ApiError 400 if it
    cannot be used here)."""
    update = parse_bound(context, session) if session is not None else SessionUpdate()
    pipeline = context.pipeline
    settings = SessionSettings(context.config, pipeline.can_speak, pipeline.voices)
    await settings.fetch_voices(update)
    try:
        settings.apply(update)
    except ProtocolError as exc:
        raise _bad(exc.code, str(exc), exc.param) from None
    except KimiAudioError as exc:  # speech asked of a text-only server
        raise _bad("invalid_value", f"session: {exc}", "session") from None
    return settings


def parse_bound(context: ServerContext, session: Any, where: str = "session", webrtc: bool = False) -> SessionUpdate:
    """A session object (bound to a key, or a call's `session` part: `webrtc`) as a
    session.update (ApiError 400 naming the field; 404 for a model this server does not serve)."""
    if not isinstance(session, dict):
        raise _bad("invalid_type", f"{where}: expected a JSON object (a realtime session)", where)
    if session.get("model") is not None:
        check_model(session["model"], context.config.server.model_aliases, f"{where}.model")
    try:
        return parse_session_update(session, where, webrtc=webrtc)
    except ProtocolError as exc:
        raise _bad(exc.code, str(exc), exc.param) from None


def bound_update(context: ServerContext, request: web.Request) -> SessionUpdate | None:
    """The session configuration of the ephemeral key that opens this request's session, if any."""
    session = bound_session(request)
    return None if session is None else parse_bound(context, session)
