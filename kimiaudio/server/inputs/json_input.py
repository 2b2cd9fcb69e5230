"""JSON from a client (HTTP bodies, data-channel and WebSocket events), parsed defensively.

One place decides what a client may send: at most `max_bytes`, UTF-8, standard JSON (no NaN,
no Infinity, no float that overflows to it like 1e400), nested at most `max_depth` deep.
Anything else is a JsonInputError with a plain message: deep nesting would otherwise escape
as RecursionError, a lone surrogate as UnicodeError, a 5,000-digit number as ValueError from
deep inside a handler.

`read_json_body(request, max_bytes)` is how a handler takes an HTTP request's JSON body:
Content-Type application/json (415 otherwise: a web page can send text/plain across origins
without asking), then `parse_json`.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from kimiaudio.errors import KimiAudioError
from kimiaudio.server.api_error import ApiError

MAX_DEPTH = 32


class JsonInputError(KimiAudioError):
    """Client JSON that cannot be used; `code` is machine-readable, the message is not."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def _no_constants(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):  # 1e400: as unusable as Infinity
        raise ValueError(f"{text[:40]} is out of range")
    return value


def parse_json(data: str | bytes, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in `data`, checked as the module docstring says."""
    if len(data) > max_bytes:
        raise JsonInputError("too_large", f"the JSON is too large ({len(data)} bytes; the limit is {max_bytes})")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise JsonInputError("invalid_json", "the JSON is not UTF-8 text") from None
    try:
        value = json.loads(data, parse_constant=_no_constants, parse_float=_finite_float)
    except RecursionError:
        raise JsonInputError("invalid_json", f"the JSON is nested too deeply (the limit is {max_depth})") from None
    except ValueError as exc:  # JSONDecodeError, too many digits, NaN/Infinity
        raise JsonInputError("invalid_json", f"not valid JSON ({exc})") from None
    _check_depth(value, max_depth)
    return value


def _check_depth(value: Any, max_depth: int) -> None:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                raise JsonInputError("invalid_json", f"the JSON is nested too deeply (the limit is {max_depth})")
            if isinstance(item, dict):
                stack.extend((key, depth + 1) for key in item)  # keys are strings to check too
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate (\ud800) decodes but cannot be stored or sent
                raise JsonInputError("invalid_json", "the JSON has a string that is not valid Unicode") from None


async def read_json_body(request: web.Request, max_bytes: int) -> Any:
    """The request's JSON body, at most `max_bytes`."""
    if request.content_type != "application/json":
        raise ApiError(
            415,
            "unsupported_media_type",
            f"send the body as Content-Type: application/json (got {request.content_type or 'none'})",
        )
    return parse_json(await request.read(), max_bytes)


async def read_json_object(request: web.Request, max_bytes: int) -> dict:
    body = await read_json_body(request, max_bytes)
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "the request body must be a JSON object")
    return body
