"""POST /api/rtc/offer: the demo page's WebRTC session (aiortc's examples/server convention).

    {sdp, type: "offer", conversation_id?, session?} -> {sdp, type, session_id, conversation_id}

The body is read and checked (sdp_offer.py; `session` as a session.update; a conversation id
that names a stored conversation), then the client is let in (transport/rtc_peer.py's
`answer_offer`). A new conversation is created at its first committed turn (announced by
conversation.created), so connecting without speaking leaves no empty conversation behind:
`conversation_id` is null until then. Without aiortc (a machine that lacks its wheels:
.ci/gpu-wheels) the offer answers 503 webrtc_unavailable and every other route serves.
"""

from __future__ import annotations

import json
import logging

from aiohttp import web

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import server_context
from kimiaudio.server.inputs.json_input import read_json_object
from kimiaudio.server.inputs.sdp_offer import MAX_SDP_BYTES, check_offer
from kimiaudio.server.routes.conversations import conversation_or_404
from kimiaudio.server.session import client_events
from kimiaudio.server.session.event_fields import ProtocolError
from kimiaudio.server.session.session_update import SessionUpdate

try:  # WebRTC needs aiortc (and PyAV); without them every other route still serves
    from kimiaudio.server.transport.rtc_peer import RtcOffer, answer_offer
except ImportError as exc:
    WEBRTC_MISSING: str | None = exc.name or "aiortc"
else:
    WEBRTC_MISSING = None

log = logging.getLogger(__name__)
MAX_OFFER_BYTES = MAX_SDP_BYTES + 16 * 1024  # the SDP, JSON-escaped, and the session settings

routes = web.RouteTableDef()


@routes.post("/api/rtc/offer")
async def offer(request: web.Request) -> web.Response:
    if WEBRTC_MISSING:
        raise ApiError(
            503,
            "webrtc_unavailable",
            f"WebRTC is not available on this server ({WEBRTC_MISSING} is not installed); "
            "the Realtime WebSocket /v1/realtime is",
        )
    context = server_context(request)
    context.sessions.check()  # a full server says so before the body is read
    body = await read_json_object(request, MAX_OFFER_BYTES)
    peer, answer = await answer_offer(context, await _offer(request, body))
    return web.json_response(
        {"sdp": answer.sdp, "type": answer.type, "session_id": peer.id, "conversation_id": peer.session.conversation.id}
    )


async def _offer(request: web.Request, body: dict) -> RtcOffer:
    """The offer body's parts, each checked."""
    sdp = body.get("sdp")
    if not isinstance(sdp, str) or not sdp.strip() or body.get("type") != "offer":
        raise ApiError(400, "bad_offer", 'expected {"sdp": "<SDP text>", "type": "offer"}')
    conversation_id = body.get("conversation_id")
    if conversation_id is not None:
        await conversation_or_404(request, conversation_id)
    update = None
    if body.get("session") is not None:
        try:
            event = client_events.parse_client_event(json.dumps({"type": "session.update", "session": body["session"]}))
        except ProtocolError as exc:
            raise ApiError(400, exc.code, str(exc)) from None
        update = event if isinstance(event, SessionUpdate) else None
    check_offer(sdp)
    return RtcOffer(sdp, update, conversation_id)


def warn_if_missing() -> None:
    """One line at start when the offer can only answer 503."""
    if WEBRTC_MISSING:
        log.warning(
            "WebRTC is off: %s is not installed (pip install aiortc av); /api/rtc/offer answers 503, "
            "the Realtime WebSocket and the HTTP routes serve",
            WEBRTC_MISSING,
        )
