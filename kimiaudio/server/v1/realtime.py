"""GET /v1/realtime: the OpenAI Realtime protocol over a WebSocket (see realtime_socket.py).

`?model=` must name the served model when given (OpenAI's clients always send it). The
connection speaks the GA shape of OpenAI's events unless the client asks for the beta shape at
the upgrade, as OpenAI tells them apart: an `OpenAI-Beta: realtime=v1` header
(`client.beta.realtime.connect()`), or the subprotocol `openai-beta.realtime-v1` (a browser's
WebSocket, which cannot set headers). A browser's offered subprotocols are answered with one
the server speaks (`realtime` or the beta one; never the `openai-insecure-api-key.*` entry that
carries its key), as a browser requires. `?intent=transcription` (GA) opens a transcription
session: it transcribes what it hears and answers nothing.

A WebSocket client takes one of the server's `server.max_sessions` slots, shared with WebRTC
clients (session_registry.py); a full server answers 503 with Retry-After before the upgrade,
as /v1/realtime/calls does. An ephemeral key that opens it brings the session configuration
bound to it (ephemeral_keys.py), applied before `?intent=`. Every connection starts a new
conversation, stored like a WebRTC one (it appears on the demo page); `conversation.select`
continues a stored one.

`?call_id=rtc_...` joins a live WebRTC call's session instead (OpenAI's sideband connection,
transport/sideband.py): with the server's API key only (an ephemeral key is the browser's),
on the instance that holds the call (404 call_not_found elsewhere); it takes no slot.
"""

from __future__ import annotations

import logging

from aiohttp import hdrs, web

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import server_context
from kimiaudio.server.ephemeral_keys import bound_update
from kimiaudio.server.inputs.openai_params import check_model
from kimiaudio.server.observe.request_log import request_record
from kimiaudio.server.session.event_shape import event_shape
from kimiaudio.server.session.session_update import SessionUpdate
from kimiaudio.server.session_registry import Admitted
from kimiaudio.server.transport import webrtc
from kimiaudio.server.transport.realtime_socket import MAX_WS_MESSAGE_BYTES, RealtimeSocket

log = logging.getLogger(__name__)
HEARTBEAT_S = 30.0  # pings find dead peers that never closed their TCP connection
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"
SUBPROTOCOLS = ("realtime", BETA_SUBPROTOCOL)  # what a browser may be answered with
INTENTS = ("transcription",)


def asks_for_beta(request: web.Request) -> bool:
    """The client asked for the beta shape (header or subprotocol); anything else is GA."""
    beta = "realtime=v1" in request.headers.get("OpenAI-Beta", "").replace(" ", "").split(",")
    offered = [p.strip() for p in request.headers.get(hdrs.SEC_WEBSOCKET_PROTOCOL, "").split(",")]
    return beta or BETA_SUBPROTOCOL in offered


async def realtime(request: web.Request) -> web.StreamResponse:
    context = server_context(request)
    if "model" in request.query:
        check_model(request.query["model"], context.config.server.model_aliases)
    if "call_id" in request.query:  # OpenAI's sideband connection to a WebRTC call
        return await _sideband(request, request.query["call_id"])
    intent = request.query.get("intent")
    if intent is not None and intent not in INTENTS:
        raise ApiError(400, "invalid_value", f"intent: expected transcription, got {intent[:40]!r}", param="intent")
    ws = web.WebSocketResponse(max_msg_size=MAX_WS_MESSAGE_BYTES, heartbeat=HEARTBEAT_S, protocols=SUBPROTOCOLS)
    if not ws.can_prepare(request).ok:
        raise ApiError(400, "websocket_expected", "GET /v1/realtime is a WebSocket: connect with a WebSocket client")
    shape = event_shape("beta" if asks_for_beta(request) else "ga")

    bound = bound_update(context, request)  # an ephemeral key's session configuration

    async def make(admitted: Admitted) -> RealtimeSocket:
        socket = RealtimeSocket(context, admitted, ws, request.transport, shape)
        if bound is not None:
            await socket.session.settings.fetch_voices(bound)
            socket.session.apply_update(bound, announce=False)  # (a 400 still: before the upgrade)
        if intent == "transcription":
            socket.session.apply_update(SessionUpdate(kind="transcription"), announce=False)
        await ws.prepare(request)  # the upgrade: after the slot is taken (503 before it)
        return socket

    async with context.sessions.opened("websocket", make) as socket:
        pass  # the upgrade is all the setup there is
    request_record(request).first_byte()  # the 101 has left (the line is written when the socket closes)
    try:
        await socket.run()
    except Exception:  # the upgrade is done: no HTTP error can be sent any more
        log.exception("session %s failed", socket.id)
    return ws


async def _sideband(request: web.Request, call_id: str) -> web.StreamResponse:
    """GET /v1/realtime?call_id=: a second connection to a live call's session (sideband.py)."""
    webrtc.require()
    context = server_context(request)  # (an ephemeral key does not open it: middleware/issued_keys.py)
    peer = webrtc.find_call(context.sessions.live(), call_id)
    if peer is None:
        message = f"call_id: no live call {call_id[:80]!r} on this server (a call lives where it was answered)"
        raise ApiError(404, "call_not_found", message, param="call_id")
    if peer.session.events.shape.api != "ga":  # (a call of the deprecated /api/rtc/offer, asked in beta)
        message = "call_id: this call speaks the beta shape, and a sideband connection speaks GA's"
        raise ApiError(400, "unsupported", message, param="call_id")
    ws = web.WebSocketResponse(max_msg_size=MAX_WS_MESSAGE_BYTES, heartbeat=HEARTBEAT_S, protocols=SUBPROTOCOLS)
    if not ws.can_prepare(request).ok:
        raise ApiError(400, "websocket_expected", "GET /v1/realtime is a WebSocket: connect with a WebSocket client")
    await ws.prepare(request)
    request_record(request).first_byte()
    sideband = webrtc.Sideband(peer, ws, request.transport)
    try:
        await sideband.run()
    except Exception:  # the upgrade is done: no HTTP error can be sent any more
        log.exception("call %s: the sideband connection failed", call_id)
    return ws
