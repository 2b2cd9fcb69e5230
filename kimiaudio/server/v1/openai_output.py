"""What the /v1 routes send in OpenAI's shapes beyond one JSON answer: server-sent event
streams (the `logprobs` objects are token_logprobs.py's).

Server-sent events: `data: {json}` blocks, then `data: [DONE]`, as OpenAI streams them (the
official clients stop reading at [DONE]); a failure after the status line is sent is an
`error` event (api_error.py), which the official clients raise.
"""

from __future__ import annotations

import json

from aiohttp import web

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.observe.request_log import request_record


async def open_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )  # proxies must not hold the stream back
    await response.prepare(request)
    return response


async def send_event(response: web.StreamResponse, data: dict) -> None:
    await response.write(b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n")


async def send_error(request: web.Request, response: web.StreamResponse, error: ApiError) -> None:
    """The `error` event; the request's log line names its code (its status is the 200 sent), and
    the metrics count it (error_responses.py), as they count an error answered with its status."""
    request_record(request).failed = error.code
    await send_event(response, error.event())


async def send_done(response: web.StreamResponse) -> None:
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
