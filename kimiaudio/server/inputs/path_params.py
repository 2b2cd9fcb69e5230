"""Path and query parameters, validated in one place before any handler uses them.

A conversation id that cannot be one is answered like an unknown one (404: ids are
unguessable and a refused one should say no more than a missing one); integers are plain
decimal digits within a bound (`int()` would take "+1", " 1", "1_0", "١" and 10**30).
"""

from __future__ import annotations

import re

from aiohttp import web

from kimiaudio.server.api_error import ApiError
from kimiaudio.store import MAX_TURN_INDEX, is_conversation_id

_DIGITS = re.compile(r"[0-9]{1,10}")


def conversation_id(request: web.Request, name: str = "id") -> str:
    value = request.match_info[name]
    if not is_conversation_id(value):
        raise ApiError(404, "conversation_not_found", f"no conversation with id {value[:80]!r}")
    return value


def bounded_int(value: str, what: str, low: int, high: int) -> int:
    if _DIGITS.fullmatch(value) is None or not low <= int(value) <= high:
        raise ApiError(400, "bad_request", f"{what} must be an integer from {low} to {high}, got {value[:40]!r}")
    return int(value)


def turn_index(request: web.Request, name: str = "index") -> int:
    return bounded_int(request.match_info[name], "the turn index", 0, MAX_TURN_INDEX)


def query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    value = request.query.get(name)
    return default if value is None else bounded_int(value, name, low, high)
