"""GET /v1/realtime: the OpenAI Realtime protocol over a WebSocket (see realtime_socket.py).

`?model=` must name the served model when given (OpenAI's clients always send it). A
WebSocket client takes one of the server's `server.max_sessions` slots, shared with WebRTC
clients (session_registry.py); a full server answers 503 with Retry-After before the upgrade,
as /api/rtc/offer does. Every connection starts a new conversation, stored like a WebRTC one
(it appears on the demo page); `conversation.select` continues a stored one.
"""

from __future__ import annotations

import logging

from aiohttp import web

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import server_context
from kimiaudio.server.inputs.openai_params import check_model
from kimiaudio.server.session_registry import Admitted
from kimiaudio.server.transport.realtime_socket import MAX_WS_MESSAGE_BYTES, RealtimeSocket

log = logging.getLogger(__name__)
HEARTBEAT_S = 30.0  # pings find dead peers that never closed their TCP connection


async def realtime(request: web.Request) -> web.StreamResponse:
    context = server_context(request)
    if "model" in request.query:
        check_model(request.query["model"], context.config.server.model_aliases)
    ws = web.WebSocketResponse(max_msg_size=MAX_WS_MESSAGE_BYTES, heartbeat=HEARTBEAT_S)
    if not ws.can_prepare(request).ok:
        raise ApiError(400, "websocket_expected", "GET /v1/realtime is a WebSocket: connect with a WebSocket client")

    async def make(admitted: Admitted) -> RealtimeSocket:
        await ws.prepare(request)  # the upgrade: after the slot is taken (503 before it)
        return RealtimeSocket(context, admitted, ws)

    async with context.sessions.opened("websocket", make) as socket:
        pass  # the upgrade is all the setup there is
    try:
        await socket.run()
    except Exception:  # the upgrade is done: no HTTP error can be sent any more
        log.exception("session %s failed", socket.id)
    return ws
