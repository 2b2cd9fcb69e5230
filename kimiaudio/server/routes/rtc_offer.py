"""POST /api/rtc/offer: deprecated, a thin alias of POST /v1/realtime/calls in JSON (aiortc's
examples/server convention), kept for clients written before the calls route:

    {sdp, type: "offer", conversation_id?, session?}
        -> {sdp, type, session_id, call_id, conversation_id}

The body is read and checked (sdp_offer.py; `session` as a session.update), then the client is
let in as a call is (transport/call_directory.py's `open_call`); `call_id` names it to
/v1/realtime/calls/{call_id}/hangup. Its events keep the beta shape the page spoke before the
calls route (session/event_shape.py), with the WebRTC events output_audio_buffer.*, on the
data channel labelled `oai-events` or `events` (the page's label before the calls route). A new
conversation is created at its first committed turn (announced by conversation.created), so
connecting without speaking leaves no empty conversation behind: `conversation_id` is null
until then. Its answers carry `Deprecation: true` and a Link to the calls route. Without
aiortc the offer answers 503 webrtc_unavailable (transport/webrtc.py).
"""

from __future__ import annotations

from aiohttp import web

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import ServerContext, server_context
from kimiaudio.server.ephemeral_keys import parse_bound
from kimiaudio.server.inputs.json_input import read_json_object
from kimiaudio.server.inputs.sdp_offer import MAX_SDP_BYTES
from kimiaudio.server.session.event_shape import event_shape
from kimiaudio.server.transport import webrtc

MAX_OFFER_BYTES = MAX_SDP_BYTES + 16 * 1024  # the SDP, JSON-escaped, and the session settings

# Says so to a client that looks (the Deprecation header's draft form; RFC 8288's Link).
# The labels its events' data channel may have: OpenAI's, and the page's before the calls route.
CHANNELS = ("oai-events", "events")

DEPRECATED = {"Deprecation": "true", "Link": '</v1/realtime/calls>; rel="successor-version"'}

routes = web.RouteTableDef()


@routes.post("/api/rtc/offer")
async def offer(request: web.Request) -> web.Response:
    webrtc.require()
    context = server_context(request)
    context.sessions.check()  # a full server says so before the body is read
    body = await read_json_object(request, MAX_OFFER_BYTES)
    peer, answer = await webrtc.open_call(context, _offer(context, body))
    return web.json_response(
        {
            "sdp": answer.sdp,
            "type": answer.type,
            "session_id": peer.id,
            "call_id": peer.call_id,
            "conversation_id": peer.session.conversation.id,
        },
        headers=DEPRECATED,
    )


def _offer(context: ServerContext, body: dict) -> webrtc.RtcOffer:
    """The offer body's parts, each checked."""
    sdp = body.get("sdp")
    if not isinstance(sdp, str) or not sdp.strip() or body.get("type") != "offer":
        raise ApiError(400, "bad_offer", 'expected {"sdp": "<SDP text>", "type": "offer"}')
    conversation_id = body.get("conversation_id")
    if conversation_id is not None and not isinstance(conversation_id, str):
        raise ApiError(404, "conversation_not_found", "no conversation with that id", param="conversation_id")
    updates = (parse_bound(context, body["session"]),) if body.get("session") is not None else ()
    return webrtc.RtcOffer(sdp, updates, conversation_id, event_shape("beta", webrtc=True), CHANNELS)
