"""Request bodies: a size limit and a read deadline for every route, and the one JSON reader.

`body_limits_middleware` applies to every request, whatever its handler does with the body:
- a Content-Length above `server.max_body_bytes` is refused (413) before anything is read
  (a chunked body is cut at the same size by aiohttp's `client_max_size`);
- the body must have arrived within `server.body_timeout_s` of the request's start, or the
  handler is stopped and the client gets 408: a body that never comes cannot hold a request
  (and what it reserved) open. Once the body is in, the handler may take as long as it needs
  (a streamed answer, a WebSocket).

`read_json(request)` is how a handler takes a JSON body: Content-Type application/json (415
otherwise: a web page can send text/plain across origins without asking), then
json_input.parse_json (size, depth, UTF-8, no NaN).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.app_keys import body_timeout_key, max_body_bytes_key
from kimiaudio.server.inputs.json_input import parse_json


@web.middleware
async def body_limits_middleware(request: web.Request, handler):
    limit = request.app[max_body_bytes_key]
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(
            413,
            "too_large",
            f"the request body is too large ({request.content_length} bytes; the limit is {limit})",
            headers={"Connection": "close"},
        )
    timeout = request.app[body_timeout_key]
    deadline = asyncio.timeout(timeout)
    body_in = False

    def on_body_in() -> None:  # called at once for a request without a body or whose body is in
        nonlocal body_in
        if not body_in and deadline.when() is not None and not deadline.expired():
            body_in = True
            deadline.reschedule(None)

    try:
        async with deadline:
            request.content.on_eof(on_body_in)
            return await handler(request)
    except TimeoutError:
        if not deadline.expired():
            raise  # the handler's own timeout, not ours
    finally:
        body_in = True  # the eof may come after the handler is done: the deadline is gone then
    raise ApiError(
        408, "body_timeout", f"the request body did not arrive within {timeout:g} s", headers={"Connection": "close"}
    )


async def read_json(request: web.Request, max_bytes: int | None = None) -> Any:
    """The request's JSON body (at most `max_bytes`, default server.max_body_bytes)."""
    if request.content_type != "application/json":
        raise ApiError(
            415,
            "unsupported_media_type",
            f"send the body as Content-Type: application/json (got {request.content_type or 'none'})",
        )
    limit = max_bytes or request.app[max_body_bytes_key]
    return parse_json(await request.read(), limit)


async def read_json_object(request: web.Request, max_bytes: int | None = None) -> dict:
    body = await read_json(request, max_bytes)
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "the request body must be a JSON object")
    return body
