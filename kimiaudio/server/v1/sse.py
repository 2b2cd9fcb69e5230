"""Server-sent events for the streaming /v1 routes: `data: {json}` blocks, then `data: [DONE]`,
as OpenAI streams them (the official clients stop reading at [DONE]). A failure after the
status line is sent is an `error` event (api_error.py), which the official clients raise."""

from __future__ import annotations

import json

from aiohttp import web

from kimiaudio.server.api_error import ApiError


async def open_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )  # proxies must not hold the stream back
    await response.prepare(request)
    return response


async def send(response: web.StreamResponse, data: dict) -> None:
    await response.write(b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n")


async def send_error(response: web.StreamResponse, error: ApiError) -> None:
    await send(response, error.event())


async def send_done(response: web.StreamResponse) -> None:
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
