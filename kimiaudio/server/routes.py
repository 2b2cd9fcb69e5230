"""HTTP routes: the demo page, the WebRTC offer, status and the conversation REST API.

    GET    /                                        the demo page (static/index.html)
    GET    /static/...                              its scripts and styles
    GET    /api/status                              model, demo flag, sessions, pipeline stats
    POST   /api/rtc/offer                           {sdp, type, conversation_id?, session?} -> {sdp, type, session_id, conversation_id}
    GET    /api/conversations                       newest first
    GET    /api/conversations/{id}                  with its turns (no audio)
    GET    /api/conversations/{id}/turns/{i}/audio  the turn's audio as WAV
    DELETE /api/conversations/{id}
    GET/POST /api/voices, DELETE /api/voices/{name}  voices (server/voice_routes.py)

Every error is JSON `{"error": {"code", "message"}}` with a 4xx/5xx status; a failure we did
not foresee is logged with its traceback and answered with a 500 that shows none.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
from pathlib import Path

from aiohttp import web
from aiortc import RTCSessionDescription

from kimiaudio import __version__
from kimiaudio.errors import KimiAudioError
from kimiaudio.server import client_events
from kimiaudio.server.app import config_key, pipeline_key, sessions_key, stack_key, store_key, vad_executor_key
from kimiaudio.server.rtc_session import RtcSession
from kimiaudio.server.v1 import setup_openai_routes

log = logging.getLogger(__name__)

# The demo page ships inside the package (package data), so any install serves it.
STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
RETRY_AFTER_S = 10
_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ApiError(web.HTTPException):
    """An HTTP error with a JSON body {"error": {"code", "message"}}."""

    def __init__(self, status: int, code: str, message: str, headers: dict | None = None):
        self.status_code = status
        super().__init__(headers=headers, text=web.json_response({"error": {"code": code, "message": message}}).text,
                         content_type="application/json")


@web.middleware
async def error_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.content_type == "application/json" or not request.path.startswith("/api/"):
            raise
        raise ApiError(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason) from None
    except KimiAudioError as exc:
        raise ApiError(400, "bad_request", str(exc)) from None
    except Exception:
        log.exception("unexpected error in %s %s", request.method, request.path)
        raise ApiError(500, "internal", "internal server error (the details are in the server log)") from None


def setup_routes(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_static("/static", STATIC_DIR)
    app.router.add_get("/api/status", status)
    app.router.add_post("/api/rtc/offer", offer)
    app.router.add_get("/api/conversations", list_conversations)
    app.router.add_get("/api/conversations/{id}", get_conversation)
    app.router.add_delete("/api/conversations/{id}", delete_conversation)
    app.router.add_get("/api/conversations/{id}/turns/{index}/audio", turn_audio)
    setup_openai_routes(app)
    from kimiaudio.server.voice_routes import setup_voice_routes  # it uses ApiError from here

    setup_voice_routes(app)


async def index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


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
        "ice_servers": list(config.server.ice_servers),
        "sessions": {"active": sum(s is not None for s in app[sessions_key].values()), "max": config.server.max_sessions},
        "pipeline": pipeline.stats() if pipeline is not None else None,
    }
    return web.json_response(body)


def _demo_message() -> str:
    from kimiaudio.pipeline.model_stack import DEMO_NOTICE

    return DEMO_NOTICE


async def offer(request: web.Request) -> web.Response:
    app = request.app
    sessions, config = app[sessions_key], app[config_key]
    if len(sessions) >= config.server.max_sessions:
        raise ApiError(503, "server_full",
                       f"the server is full ({config.server.max_sessions} sessions); try again in a few seconds",
                       headers={"Retry-After": str(RETRY_AFTER_S)})
    body = await _json_object(request)
    sdp, kind = body.get("sdp"), body.get("type")
    if not isinstance(sdp, str) or not sdp.strip() or kind != "offer":
        raise ApiError(400, "bad_offer", 'expected {"sdp": "<SDP text>", "type": "offer"}')
    if "m=audio" not in sdp:
        raise ApiError(400, "bad_offer", "the offer has no audio track: send the microphone with the offer")
    conversation_id = body.get("conversation_id")
    if conversation_id is not None:
        await _conversation_or_404(request, conversation_id)
    update = None
    if body.get("session") is not None:
        try:
            update = client_events.parse_client_event(_session_update_json(body["session"]))
        except client_events.ProtocolError as exc:
            raise ApiError(400, exc.code, str(exc)) from None

    from kimiaudio.audio.vad import SileroVad

    session_id = f"sess_{secrets.token_hex(8)}"
    sessions[session_id] = None  # hold the slot while the session is being set up
    session = None
    try:
        vad = await asyncio.get_running_loop().run_in_executor(app[vad_executor_key], SileroVad)
        session = RtcSession(session_id, config, app[pipeline_key], app[store_key], vad, app[vad_executor_key],
                             conversation_id, on_closed=lambda s: sessions.pop(s.id, None))
        if update is not None:
            try:
                session.session.apply_update(update, announce=False)
            except KimiAudioError as exc:
                raise ApiError(400, "invalid_value", str(exc)) from None
        answer = await session.accept(RTCSessionDescription(sdp=sdp, type="offer"))
    except ApiError:
        await _discard(sessions, session_id, session)
        raise
    except KimiAudioError as exc:
        await _discard(sessions, session_id, session)
        raise ApiError(400, "bad_offer", str(exc)) from None
    except Exception as exc:
        await _discard(sessions, session_id, session)
        raise ApiError(400, "bad_offer", f"the SDP offer could not be used ({type(exc).__name__}: {exc})") from None
    sessions[session_id] = session
    # A new conversation is created at its first committed turn (announced by conversation.created),
    # so connecting without speaking leaves no empty conversation behind: null until then.
    return web.json_response({"sdp": answer.sdp, "type": answer.type, "session_id": session_id,
                              "conversation_id": conversation_id})


async def _discard(sessions: dict, session_id: str, session: RtcSession | None) -> None:
    sessions.pop(session_id, None)
    if session is not None:
        await session.close()


def _session_update_json(session) -> str:
    return json.dumps({"type": "session.update", "session": session})


async def _json_object(request: web.Request) -> dict:
    try:
        body = await request.json()
    except (ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
        raise ApiError(400, "invalid_json", "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "the request body must be a JSON object")
    return body


async def _conversation_or_404(request: web.Request, conversation_id) -> dict:
    conversation = None
    if isinstance(conversation_id, str) and _ID_PATTERN.match(conversation_id):
        conversation = await request.app[store_key].get_conversation(conversation_id)
    if conversation is None:
        raise ApiError(404, "conversation_not_found", f"no conversation with id {conversation_id!r}")
    return conversation


async def list_conversations(request: web.Request) -> web.Response:
    try:
        limit = int(request.query.get("limit", "100"))
    except ValueError:
        raise ApiError(400, "bad_request", "limit must be an integer") from None
    if not 1 <= limit <= 1000:
        raise ApiError(400, "bad_request", "limit must be between 1 and 1000")
    return web.json_response({"conversations": await request.app[store_key].list_conversations(limit)})


async def get_conversation(request: web.Request) -> web.Response:
    return web.json_response(await _conversation_or_404(request, request.match_info["id"]))


async def delete_conversation(request: web.Request) -> web.Response:
    conversation_id = request.match_info["id"]
    await _conversation_or_404(request, conversation_id)
    await request.app[store_key].delete_conversation(conversation_id)
    return web.json_response({"deleted": conversation_id})


async def turn_audio(request: web.Request) -> web.Response:
    conversation_id = request.match_info["id"]
    await _conversation_or_404(request, conversation_id)
    try:
        index = int(request.match_info["index"])
    except ValueError:
        raise ApiError(400, "bad_request", "the turn index must be an integer") from None
    wav = await request.app[store_key].turn_audio_wav(conversation_id, index)
    if wav is None:
        raise ApiError(404, "audio_not_found", f"conversation {conversation_id!r} has no audio for turn {index}")
    return web.Response(body=wav, content_type="audio/wav",
                        headers={"Content-Disposition": f'inline; filename="turn-{index}.wav"'})
