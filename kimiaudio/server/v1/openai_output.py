"""What the /v1 routes send in OpenAI's shapes beyond one JSON answer: server-sent event streams
and the `logprobs` object.

Server-sent events: `data: {json}` blocks, then `data: [DONE]`, as OpenAI streams them (the
official clients stop reading at [DONE]); a failure after the status line is sent is an
`error` event (api_error.py), which the official clients raise.

The logprobs object of a chat choice, from the pipeline's TokenLogprob values:
{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
"refusal": null}. `bytes` are the token's exact UTF-8 bytes (a token may hold part of a
character: its `token` text then shows U+FFFD).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from aiohttp import web

from kimiaudio.pipeline.events import TokenLogprob
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
    """The `error` event; the request's log line names its code (its status is the 200 sent)."""
    request_record(request).failed = error.code
    await send_event(response, error.event())


async def send_done(response: web.StreamResponse) -> None:
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()


def _token(token_bytes: bytes, logprob: float) -> dict:
    return {"token": token_bytes.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(token_bytes)}


def logprobs_object(entries: Iterable[TokenLogprob]) -> dict:
    return {
        "content": [
            {**_token(entry.token_bytes, entry.logprob), "top_logprobs": [_token(b, lp) for b, lp in entry.top]}
            for entry in entries
        ],
        "refusal": None,
    }
