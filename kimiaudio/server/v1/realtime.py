"""GET /v1/realtime: the OpenAI Realtime protocol over a WebSocket (see ws_session.py).

`?model=` must name the served model when given (OpenAI's clients always send it). A
WebSocket session takes one of the server's `server.max_sessions` slots, shared with WebRTC
sessions; a full server answers 503 with Retry-After before the upgrade, as /api/rtc/offer does.
Every connection starts a new conversation, stored like a WebRTC one (it appears on the
demo page); `conversation.select` continues a stored one.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from aiohttp import web

from kimiaudio.server.app_keys import admission_key
from kimiaudio.server.app_keys import config_key, pipeline_key, sessions_key, store_key, vad_executor_key
from kimiaudio.server.app_keys import server_metrics_key
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.v1.models import check_model
from kimiaudio.server.transport.ws_session import MAX_WS_MESSAGE_BYTES, WsSession

log = logging.getLogger(__name__)
RETRY_AFTER_S = 10
HEARTBEAT_S = 30.0  # pings find dead peers that never closed their TCP connection


async def realtime(request: web.Request) -> web.StreamResponse:
    app = request.app
    if "model" in request.query:
        check_model(request.query["model"])
    sessions, config = app[sessions_key], app[config_key]
    ws = web.WebSocketResponse(max_msg_size=MAX_WS_MESSAGE_BYTES, heartbeat=HEARTBEAT_S)
    if not ws.can_prepare(request).ok:
        raise ApiError(400, "websocket_expected", "GET /v1/realtime is a WebSocket: connect with a WebSocket client")
    slot = app[admission_key].reserve()  # 503 (full or shutting down) before the upgrade
    from kimiaudio.audio.vad import SileroVad

    session_id = f"sess_{secrets.token_hex(8)}"
    try:
        vad = await asyncio.get_running_loop().run_in_executor(app[vad_executor_key], SileroVad)
        await ws.prepare(request)
    except BaseException:
        slot.release()
        raise

    def closed(session: WsSession) -> None:
        sessions.pop(session.id, None)
        slot.release()

    session = WsSession(session_id, ws, config, app[pipeline_key], app[store_key], vad, app[vad_executor_key],
                        on_closed=closed, metrics=app[server_metrics_key])
    sessions[session_id] = session
    try:
        await session.run()
    except Exception:  # the upgrade is done: no HTTP error can be sent any more
        log.exception("session %s failed", session_id)
    return ws
