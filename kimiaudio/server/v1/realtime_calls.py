"""WebRTC calls as OpenAI's Realtime API takes them (`client.realtime.calls`, the browser flow).

    POST /v1/realtime/calls[?conversation_id=ID]   the SDP offer -> 201, the SDP answer
    POST /v1/realtime/calls/{call_id}/hangup       end the call -> 200
    POST /v1/realtime/calls/{call_id}/accept | reject | refer   SIP only: 400
    POST /v1/realtime?model=M[&conversation_id=ID]  the beta API's call: the same, beta events

The offer comes as the raw SDP (`Content-Type: application/sdp`, what a browser with an
ephemeral key sends) or as `multipart/form-data` with the parts `sdp` and `session` (a GA
session object as JSON, what `client.realtime.calls.create(sdp=, session=)` sends). The answer
is the SDP answer (`application/sdp`, 201) with the call id in `Location`
(`/v1/realtime/calls/rtc_...`), as OpenAI answers. The session starts with the configuration
bound to the ephemeral key that opened it, if any, then the call's own `session`
(ephemeral_keys.py). The call carries the same RealtimeSession as the WebSocket: its events
travel as JSON on the client's data channel named `oai-events` (OpenAI's label; any other
is left unused), the audio both ways on the media tracks (transport/rtc_peer.py).
`conversation_id` continues a stored conversation, as `conversation.select` does on the
channel. The beta API's browser flow (a key from POST /v1/realtime/sessions, the SDP offer
POSTed to /v1/realtime itself) is the same call whose events take the beta shape
(session/event_shape.py).

Admission is the WebSocket's and the page's: a full server answers 503 (Retry-After) before
the body is read, a held conversation 409 conversation_busy; the API key (or an ephemeral
key), Host and Origin are checked by the app's access middleware. A bad offer, body or
content type is a 4xx in OpenAI's error shape; so is a call id naming no live call (404
call_not_found). A hang-up ends its call whichever instance of a fleet it reaches
(transport/call_directory.py). Without aiortc both answer 503 webrtc_unavailable
(transport/webrtc.py).
"""

from __future__ import annotations

from aiohttp import web

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import server_context
from kimiaudio.server.ephemeral_keys import bound_update, parse_bound
from kimiaudio.server.inputs.json_input import JsonInputError, parse_json
from kimiaudio.server.inputs.multipart_form import read_form
from kimiaudio.server.inputs.openai_params import check_model
from kimiaudio.server.inputs.realtime_params import CALL_FIELDS
from kimiaudio.server.inputs.sdp_offer import MAX_SDP_BYTES
from kimiaudio.server.session.event_shape import EventShape, event_shape
from kimiaudio.server.session.session_update import SessionUpdate
from kimiaudio.server.transport import webrtc

MAX_SESSION_BYTES = 256 * 1024  # the `session` part: long instructions fit
SDP = "application/sdp"
FORM = "multipart/form-data"
EXPECTED = f"the SDP offer as {SDP}, or {FORM} with the parts sdp and session (JSON)"


async def create_call(request: web.Request) -> web.Response:
    return await _call(request, None)


async def create_beta_call(request: web.Request) -> web.Response:
    """The beta API's WebRTC call (POST /v1/realtime?model=...): its events in the beta shape."""
    return await _call(request, event_shape("beta", webrtc=True))


async def _call(request: web.Request, shape: EventShape | None) -> web.Response:
    """Open a call from the request's offer; `shape`: its events' (None: GA)."""
    webrtc.require()
    context = server_context(request)
    if "model" in request.query:
        check_model(request.query["model"], context.config.server.model_aliases)
    context.sessions.check()  # a full server says so before the body is read
    sdp, session = await _read_offer(request)
    updates: list[SessionUpdate] = []  # the key's configuration first: the call's own overrides it
    if (bound := bound_update(context, request)) is not None:
        updates.append(bound)
    if session is not None:
        updates.append(parse_bound(context, _session_json(session), webrtc=True))
    offer = webrtc.RtcOffer(sdp, tuple(updates), request.query.get("conversation_id") or None, shape)
    peer, answer = await webrtc.open_call(context, offer)
    return web.Response(
        status=201,
        body=answer.sdp.encode("utf-8"),
        content_type=SDP,
        headers={"Location": f"/v1/realtime/calls/{peer.call_id}"},
    )


async def _read_offer(request: web.Request) -> tuple[str, bytes | None]:
    """(the SDP offer, checked; the `session` part's bytes, if sent)."""
    if request.content_type == SDP:
        body = await request.read()
        if len(body) > MAX_SDP_BYTES:
            raise ApiError(413, "too_large", f"the SDP offer is larger than {MAX_SDP_BYTES} bytes")
        if not body.strip():
            raise ApiError(400, "missing_required_parameter", f"the body is empty: expected {EXPECTED}", param="sdp")
        return _sdp_text(body), None
    if request.content_type == FORM:
        unknown: list[str] = []
        limits = {"sdp": MAX_SDP_BYTES, "session": MAX_SESSION_BYTES}
        fields = await read_form(request, limits, ("sdp",), EXPECTED, unknown=unknown)
        CALL_FIELDS.check(dict.fromkeys(unknown, ""))
        session = fields.get("session")
        return _sdp_text(fields["sdp"].data), session.data if session is not None and session.data else None
    raise ApiError(415, "unsupported_media_type", f"expected {EXPECTED} (got {request.content_type or 'none'})")


def _sdp_text(data: bytes) -> str:
    """The offer's text (the offer itself is checked by answer_offer: transport/rtc_peer.py)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "bad_offer", "the SDP offer is not UTF-8 text", param="sdp") from None


def _session_json(data: bytes) -> object:
    """The `session` part: JSON (a client that forgot JSON.stringify sends `[object Object]`)."""
    try:
        return parse_json(data, MAX_SESSION_BYTES)
    except JsonInputError as exc:
        raise ApiError(400, "invalid_json", f"session: expected a JSON object ({exc})", param="session") from None


async def hangup(request: web.Request) -> web.Response:
    """End a call (on whichever instance holds it: transport/call_directory.py); what was heard is stored."""
    webrtc.require()
    call_id = request.match_info["call_id"]
    if not await webrtc.hang_up(server_context(request), call_id):
        raise ApiError(404, "call_not_found", f"no live call with id {call_id[:80]!r}", param="call_id")
    return web.Response(status=200)


async def sip_only(request: web.Request) -> web.Response:
    action = request.match_info["action"]
    raise ApiError(
        400,
        "unsupported",
        f"/v1/realtime/calls/{{call_id}}/{action} is for SIP calls; this server takes WebRTC calls only "
        "(POST /v1/realtime/calls, then /hangup)",
    )
