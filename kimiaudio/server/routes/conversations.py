"""The stored conversations: list, read, replay, delete.

    GET    /api/conversations[?q=words][&limit=N][&cursor=C]
                                                    newest first; q: those where the words were said;
                                                    has_more, and next_cursor for the next page
    GET    /api/conversations/{id}                  with its turns (no audio)
    GET    /api/conversations/{id}/turns/{i}/audio  the turn's audio as WAV (or a byte range of it)
    DELETE /api/conversations/{id}                  409 conversation_busy while a live session holds it

Path and query values are checked here before anything uses them: a conversation id that
cannot be one is answered like an unknown one (404: ids are unguessable and a refused one
should say no more than a missing one); integers are plain decimal digits within a bound
(`int()` would take "+1", " 1", "1_0", "١" and 10**30).
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import server_context
from kimiaudio.server.routes.byte_range import ranged_response
from kimiaudio.store import MAX_TURN_INDEX, is_conversation_id
from kimiaudio.store.conversation_pages import PageCursorError, page_end, read_cursor
from kimiaudio.store.search import SearchQueryError

_DIGITS = re.compile(r"[0-9]{1,10}")

routes = web.RouteTableDef()


@routes.get("/api/conversations")
async def list_conversations(request: web.Request) -> web.Response:
    limit = _query_int(request, "limit", 100, 1, 1000)
    try:
        after = read_cursor(request.query["cursor"]) if "cursor" in request.query else None
    except PageCursorError as exc:
        raise ApiError(400, "invalid_value", str(exc), param="cursor") from None
    try:  # one more than asked for says whether there are more
        found = await server_context(request).store.list_conversations(limit + 1, request.query.get("q", ""), after)
    except SearchQueryError as exc:
        raise ApiError(400, "invalid_value", str(exc), param="q") from None
    page, more = found[:limit], len(found) > limit
    return web.json_response(
        {"conversations": page, "has_more": more, "next_cursor": page_end(page[-1]).cursor() if more else None}
    )


@routes.get("/api/conversations/{id}")
async def get_conversation(request: web.Request) -> web.Response:
    return web.json_response(await conversation_or_404(request, _conversation_id(request)))


@routes.delete("/api/conversations/{id}")
async def delete_conversation(request: web.Request) -> web.Response:
    conversation_id = _conversation_id(request)
    await conversation_or_404(request, conversation_id)
    if not await server_context(request).store.delete_conversation(conversation_id):  # (a concurrent delete)
        raise ApiError(404, "conversation_not_found", f"no conversation with id {conversation_id[:80]!r}")
    return web.json_response({"deleted": conversation_id})


@routes.get("/api/conversations/{id}/turns/{index}/audio")
async def turn_audio(request: web.Request) -> web.Response:
    conversation_id = _conversation_id(request)
    index = _bounded_int(request.match_info["index"], "the turn index", 0, MAX_TURN_INDEX)
    await conversation_or_404(request, conversation_id)
    wav = await server_context(request).store.turn_audio_wav(conversation_id, index)
    if wav is None:
        raise ApiError(404, "audio_not_found", f"conversation {conversation_id!r} has no audio for turn {index}")
    return ranged_response(request, wav, "audio/wav", {"Content-Disposition": f'inline; filename="turn-{index}.wav"'})


async def conversation_or_404(request: web.Request, conversation_id: Any) -> dict:
    """The stored conversation `conversation_id` names (any client value), or ApiError 404."""
    conversation = None
    if is_conversation_id(conversation_id):
        conversation = await server_context(request).store.get_conversation(conversation_id)
    if conversation is None:
        shown = conversation_id[:80] if isinstance(conversation_id, str) else conversation_id
        raise ApiError(404, "conversation_not_found", f"no conversation with id {shown!r}")
    return conversation


def _conversation_id(request: web.Request) -> str:
    value = request.match_info["id"]
    if not is_conversation_id(value):
        raise ApiError(404, "conversation_not_found", f"no conversation with id {value[:80]!r}")
    return value


def _bounded_int(value: str, what: str, low: int, high: int) -> int:
    if _DIGITS.fullmatch(value) is None or not low <= int(value) <= high:
        raise ApiError(400, "bad_request", f"{what} must be an integer from {low} to {high}, got {value[:40]!r}")
    return int(value)


def _query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    value = request.query.get(name)
    return default if value is None else _bounded_int(value, name, low, high)
