"""One log line per /v1 request: what it was answered, or why it was refused.

The /v1 sub-application's outermost middleware (`request_log_middleware`, v1/api.py) gives
each of its requests a RequestRecord (requests the app refused before they reached /v1, by
their Host, API key, body size or while draining, are counted in the metrics instead); the
route fills in the audio it took and gave (seconds) and marks when the first byte of the
answer left (a stream's first text or audio; a whole answer when it is returned). When the
request ends, one INFO line goes to the `kimiaudio.requests` logger:

    request POST /v1/chat/completions status=200 audio_in_s=2.6 audio_out_s=3.1 first_byte_s=0.41 done_s=1.9
    request POST /v1/chat/completions status=400 refused=unsupported_parameter param=tools
    request POST /v1/chat/completions status=200 failed=shutting_down audio_in_s=2.6 audio_out_s=0.8 ...
    request POST /v1/audio/transcriptions status=499 cancelled=client_closed audio_in_s=119.9 done_s=0.4

(the third: a stream that ended with an `error` event, here an answer cut at the end of a
shutdown's grace). A client that hangs up is no failure of the server: its request is
`cancelled=client_closed`, with nginx's status 499 when no answer had begun (no status line was
sent; the ApiError with code CLIENT_CLOSED that ends it is never sent either, and the metrics
do not count it as an error), and with the status sent when a stream was cut. The path is
written as log_values.py writes any value: quoted and escaped if a client put a newline or
another control character in it.

A WebSocket (/v1/realtime) is one line when it closes, its first byte the upgrade's 101 (its
answers have their own `turn` lines, turn_log.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.observe.log_values import key_values, log_value

log = logging.getLogger("kimiaudio.requests")

CLIENT_CLOSED = "client_closed"  # the code of a request its client hung up on
CLIENT_CLOSED_STATUS = 499  # nginx's "client closed request": logged, never sent


def client_closed() -> ApiError:
    """What ends a request whose client went away: the log's 499, never sent."""
    return ApiError(CLIENT_CLOSED_STATUS, CLIENT_CLOSED, "the client closed the connection")


@dataclass
class RequestRecord:
    start: float  # time.monotonic() when the request came in
    audio_in_s: float | None = None
    audio_out_s: float | None = None
    first_byte_s: float | None = None
    failed: str | None = None  # the code of the `error` event that ended a stream
    cancelled: str | None = None  # CLIENT_CLOSED: a stream its client hung up on

    def first_byte(self) -> None:
        """The answer's first byte leaves now (only the first call counts)."""
        if self.first_byte_s is None:
            self.first_byte_s = time.monotonic() - self.start

    def add_audio_out(self, seconds: float) -> None:
        self.audio_out_s = (self.audio_out_s or 0.0) + seconds


_RECORD = web.RequestKey("request_record", RequestRecord)


def request_record(request: web.Request) -> RequestRecord:
    """The request's record (a detached one outside the middleware: tests calling a handler)."""
    record = request.get(_RECORD)
    return record if record is not None else RequestRecord(time.monotonic())


@web.middleware
async def request_log_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    record = request[_RECORD] = RequestRecord(time.monotonic())
    where = f"{request.method} {log_value(request.path)}"
    try:
        response = await handler(request)
    except ApiError as exc:
        fields: dict[str, int | float | str | None] = {"status": exc.status, "refused": exc.code, "param": exc.param}
        if exc.code == CLIENT_CLOSED:
            fields = {
                "status": CLIENT_CLOSED_STATUS,
                "cancelled": CLIENT_CLOSED,
                "audio_in_s": record.audio_in_s,
                "done_s": time.monotonic() - record.start,
            }
        elif exc.status >= 500:
            fields = {"status": exc.status, "failed": exc.code}
        log.info("request %s %s", where, _line(fields))
        raise
    record.first_byte()
    done: dict[str, int | float | str | None] = {
        "status": response.status,
        "failed": record.failed,
        "cancelled": record.cancelled,
        "audio_in_s": record.audio_in_s,
        "audio_out_s": record.audio_out_s,
        "first_byte_s": record.first_byte_s,
        "done_s": time.monotonic() - record.start,
    }
    log.info("request %s %s", where, _line(done))
    return response


def _line(fields: dict[str, int | float | str | None]) -> str:
    return key_values({k: round(v, 3) if isinstance(v, float) else v for k, v in fields.items() if v is not None})
