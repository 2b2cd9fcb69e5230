"""Request bodies: a size limit and a read deadline for every route.

`body_limits_middleware(max_bytes, timeout_s)` applies to every request, whatever its handler
does with the body:
- a Content-Length above `server.max_body_bytes` is refused (413) before anything is read
  (a chunked body is cut at the same size by aiohttp's `client_max_size`);
- the body must have arrived within `server.body_timeout_s` of the request's start, or the
  handler is stopped and the client gets 408: a body that never comes cannot hold a request
  (and what it reserved) open. Once the body is in, the handler may take as long as it needs
  (a streamed answer, a WebSocket).
A JSON body is read by inputs/json_input.py's `read_json_body`.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from kimiaudio.server.api_error import ApiError


def body_limits_middleware(max_bytes: int, timeout_s: float) -> Middleware:
    """The middleware that holds every request's body to `max_bytes` and `timeout_s`."""

    @web.middleware
    async def limit_body(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.content_length is not None and request.content_length > max_bytes:
            raise ApiError(
                413,
                "too_large",
                f"the request body is too large ({request.content_length} bytes; the limit is {max_bytes})",
                headers={"Connection": "close"},
            )
        deadline = asyncio.timeout(timeout_s)
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
            408,
            "body_timeout",
            f"the request body did not arrive within {timeout_s:g} s",
            headers={"Connection": "close"},
        )

    return limit_body
