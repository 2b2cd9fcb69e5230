"""HTTP routes: the demo page, the WebRTC offer, status and the conversation REST API.

    GET    /                                        the demo page (static/index.html)
    GET    /static/...                              its scripts and styles
    GET    /api/auth                                {"required": bool}: does the server need an API key
    GET    /api/status                              model, demo flag, sessions, pipeline stats
    POST   /api/rtc/offer                           {sdp, type, conversation_id?, session?}
                                                    -> {sdp, type, session_id, conversation_id}
    GET    /api/conversations[?q=words]             newest first; q: those where the words were said
    GET    /api/conversations/{id}                  with its turns (no audio)
    GET    /api/conversations/{id}/turns/{i}/audio  the turn's audio as WAV
    DELETE /api/conversations/{id}                  409 conversation_busy while a live session holds it
    GET/POST /api/voices, DELETE /api/voices/{name}  voices (server/voice_routes.py)

Every input is checked where it enters: bodies by request_body.py, path and query values by
path_params.py, the SDP by sdp_offer.py; errors are JSON (api_error.py).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from aiohttp import web

from kimiaudio import __version__
from kimiaudio.errors import KimiAudioError
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.app_keys import (
    access_key,
    admission_key,
    config_key,
    pipeline_key,
    server_metrics_key,
    stack_key,
    store_key,
    vad_executor_key,
)
from kimiaudio.server.inputs import path_params
from kimiaudio.server.inputs.sdp_offer import MAX_SDP_BYTES, check_offer
from kimiaudio.server.middleware.request_body import read_json_object
from kimiaudio.server.session import client_events
from kimiaudio.server.session_registry import opened_session
from kimiaudio.server.transport.ice_servers import ice_servers
from kimiaudio.server.v1.routes import setup_openai_routes
from kimiaudio.server.voice_routes import setup_voice_routes
from kimiaudio.store import is_conversation_id
from kimiaudio.store.search import SearchQueryError

try:  # WebRTC needs aiortc (and PyAV); without them every other route still serves
    from aiortc import RTCSessionDescription

    from kimiaudio.server.transport.rtc_peer import RtcPeer
except ImportError as exc:
    WEBRTC_MISSING: str | None = exc.name or "aiortc"
else:
    WEBRTC_MISSING = None

log = logging.getLogger(__name__)

# The demo page ships inside the package (package data), so any install serves it.
STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
MAX_OFFER_BYTES = MAX_SDP_BYTES + 16 * 1024  # the SDP, JSON-escaped, and the session settings


def setup_routes(app: web.Application) -> None:
    if WEBRTC_MISSING:
        log.warning(
            "WebRTC is off: %s is not installed (pip install aiortc av); /api/rtc/offer answers 503, "
            "the Realtime WebSocket and the HTTP routes serve",
            WEBRTC_MISSING,
        )
    app.router.add_get("/", index)
    app.router.add_static("/static", STATIC_DIR)
    app.router.add_get("/api/auth", auth)
    app.router.add_get("/api/status", status)
    app.router.add_post("/api/rtc/offer", offer)
    app.router.add_get("/api/conversations", list_conversations)
    app.router.add_get("/api/conversations/{id}", get_conversation)
    app.router.add_delete("/api/conversations/{id}", delete_conversation)
    app.router.add_get("/api/conversations/{id}/turns/{index}/audio", turn_audio)
    setup_openai_routes(app)
    setup_voice_routes(app)


async def index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


async def auth(request: web.Request) -> web.Response:
    """Unauthenticated: tells the page whether to ask for a key (and says nothing else)."""
    return web.json_response({"required": bool(request.app[access_key].api_key)})


async def status(request: web.Request) -> web.Response:
    app = request.app
    stack, pipeline, config = app[stack_key], app[pipeline_key], app[config_key]
    is_demo = bool(stack is not None and stack.is_demo)
    body = {
        "status": "ok",
        "version": __version__,
        "model": {"path": str(stack.paths.root) if stack is not None else None, "is_demo": is_demo},
        "demo_weights": is_demo,
        "demo_message": _demo_message() if is_demo else None,
        "ice_servers": ice_servers(config, time.time()),  # TURN with fresh credentials
        "sessions": {"active": app[admission_key].num_reserved, "max": config.server.max_sessions},
        "pipeline": pipeline.stats() if pipeline is not None else None,
    }
    return web.json_response(body)


def _demo_message() -> str:
    from kimiaudio.pipeline.model_stack import DEMO_NOTICE

    return DEMO_NOTICE


async def offer(request: web.Request) -> web.Response:
    if WEBRTC_MISSING:
        raise ApiError(
            503,
            "webrtc_unavailable",
            f"WebRTC is not available on this server ({WEBRTC_MISSING} is not installed); "
            "the Realtime WebSocket /v1/realtime is",
        )
    app = request.app
    admission = app[admission_key]
    admission.check()  # a full server says so before the body is read
    body = await read_json_object(request, MAX_OFFER_BYTES)
    sdp, update, conversation_id = await _offer_fields(request, body)

    async def make(session_id: str, vad, on_closed) -> RtcPeer:
        return RtcPeer(
            session_id,
            app[config_key],
            app[pipeline_key],
            app[store_key],
            vad,
            app[vad_executor_key],
            conversation_id,
            on_closed=on_closed,
            metrics=app[server_metrics_key],
        )

    # The slot is checked and taken in one step, after the body is in: a stalled body holds none.
    async with opened_session(app, "webrtc", make) as peer:
        await peer.session.conversation.open()  # its lease: 409 conversation_busy if held elsewhere
        if update is not None:
            try:
                peer.session.apply_update(update, announce=False)
            except KimiAudioError as exc:
                raise ApiError(400, "invalid_value", str(exc)) from None
        answer = await _accept(peer, sdp)
    # A new conversation is created at its first committed turn (announced by conversation.created),
    # so connecting without speaking leaves no empty conversation behind: null until then.
    return web.json_response(
        {"sdp": answer.sdp, "type": answer.type, "session_id": peer.id, "conversation_id": conversation_id}
    )


async def _offer_fields(request: web.Request, body: dict) -> tuple[str, client_events.SessionUpdate | None, str | None]:
    """(sdp, session.update or None, conversation id or None) of an offer body, each checked."""
    sdp = body.get("sdp")
    if not isinstance(sdp, str) or not sdp.strip() or body.get("type") != "offer":
        raise ApiError(400, "bad_offer", 'expected {"sdp": "<SDP text>", "type": "offer"}')
    conversation_id = body.get("conversation_id")
    if conversation_id is not None:
        await _conversation_or_404(request, conversation_id)
    update = None
    if body.get("session") is not None:
        try:
            update = client_events.parse_client_event(
                json.dumps({"type": "session.update", "session": body["session"]})
            )
        except client_events.ProtocolError as exc:
            raise ApiError(400, exc.code, str(exc)) from None
    check_offer(sdp)
    return sdp, update, conversation_id


async def _accept(peer: RtcPeer, sdp: str) -> RTCSessionDescription:
    try:
        return await peer.accept(RTCSessionDescription(sdp=sdp, type="offer"))
    except KimiAudioError as exc:
        raise ApiError(400, "bad_offer", str(exc)) from None
    except Exception as exc:  # aiortc refusing an offer that passed our checks (e.g. no common codec)
        log.info("session %s: aiortc refused the offer (%s: %s)", peer.id, type(exc).__name__, exc)
        raise ApiError(
            400, "bad_offer", "the SDP offer could not be used (no common audio codec or transport?)"
        ) from None


async def _conversation_or_404(request: web.Request, conversation_id) -> dict:
    conversation = None
    if is_conversation_id(conversation_id):
        conversation = await request.app[store_key].get_conversation(conversation_id)
    if conversation is None:
        shown = conversation_id[:80] if isinstance(conversation_id, str) else conversation_id
        raise ApiError(404, "conversation_not_found", f"no conversation with id {shown!r}")
    return conversation


async def list_conversations(request: web.Request) -> web.Response:
    limit = path_params.query_int(request, "limit", 100, 1, 1000)
    try:
        found = await request.app[store_key].list_conversations(limit, request.query.get("q", ""))
    except SearchQueryError as exc:
        raise ApiError(400, "invalid_value", str(exc), param="q") from None
    return web.json_response({"conversations": found})


async def get_conversation(request: web.Request) -> web.Response:
    return web.json_response(await _conversation_or_404(request, path_params.conversation_id(request)))


async def delete_conversation(request: web.Request) -> web.Response:
    conversation_id = path_params.conversation_id(request)
    await _conversation_or_404(request, conversation_id)
    await request.app[store_key].delete_conversation(conversation_id)
    return web.json_response({"deleted": conversation_id})


async def turn_audio(request: web.Request) -> web.Response:
    conversation_id = path_params.conversation_id(request)
    index = path_params.turn_index(request)
    await _conversation_or_404(request, conversation_id)
    wav = await request.app[store_key].turn_audio_wav(conversation_id, index)
    if wav is None:
        raise ApiError(404, "audio_not_found", f"conversation {conversation_id!r} has no audio for turn {index}")
    return web.Response(
        body=wav, content_type="audio/wav", headers={"Content-Disposition": f'inline; filename="turn-{index}.wav"'}
    )
