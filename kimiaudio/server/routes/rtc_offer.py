"""POST /api/rtc/offer: the demo page's WebRTC session (aiortc's examples/server convention).

    {sdp, type: "offer", conversation_id?, session?} -> {sdp, type, session_id, conversation_id}

The body is read and checked (sdp_offer.py; `session` as a session.update; a conversation id
that names a stored conversation), then the client is let in (transport/rtc_peer.py's
`answer_offer`). A new conversation is created at its first committed turn (announced by
conversation.created), so connecting without speaking leaves no empty conversation behind:
`conversation_id` is null until then.
"""

from __future__ import annotations

import json

from aiohttp import web

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import server_context
from kimiaudio.server.inputs.json_input import read_json_object
from kimiaudio.server.inputs.sdp_offer import MAX_SDP_BYTES, check_offer
from kimiaudio.server.routes.conversations import conversation_or_404
from kimiaudio.server.session import client_events
from kimiaudio.server.session.event_fields import ProtocolError
from kimiaudio.server.session.session_update import SessionUpdate
from kimiaudio.server.transport.rtc_peer import RtcOffer, answer_offer

MAX_OFFER_BYTES = MAX_SDP_BYTES + 16 * 1024  # the SDP, JSON-escaped, and the session settings

routes = web.RouteTableDef()


@routes.post("/api/rtc/offer")
async def offer(request: web.Request) -> web.Response:
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
