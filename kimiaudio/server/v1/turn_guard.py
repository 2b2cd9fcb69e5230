"""One pipeline turn for one HTTP request, cancelled the moment its client goes away.

aiohttp does not cancel a handler when its client disconnects, and a write to a closed
connection may only fail later, so a watcher polls the connection every WATCH_INTERVAL_S
while the turn runs: a client that disconnects (mid-answer or while waiting for it) gets its
turn cancelled at once, which frees its KV blocks and detokenizer state on the workers. The
turn is also cancelled if the handler ends any other way before it is done (an error, a
failed write, a handler cancelled by a shutdown). A turn that did not complete is answered by
`failed_turn_error`: the client's error when the request was at fault (a prompt too long for
engine.max_model_len), `client_closed` when its client went away (no error of the server's: the
request log's 499, not counted in the metrics, observe/request_log.py), the server's otherwise.
A streamed answer opens its stream at the turn's first event (`once_started`), so a turn refused
before it starts is answered with that error's status, as OpenAI answers it, not with a 200
holding an error event.

While its turn runs, an answer is counted in the server's AnswersInFlight (context.py), which a
graceful shutdown waits for (serve.py's drain). One still running when the shutdown grace ends
is cut there: its turn is cancelled and `failed_turn_error` answers it 503 `shutting_down` (an
`error` event if its stream is open), as a turn that would start after that is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.events import PipelineEvent, TurnDone
from kimiaudio.pipeline.turn_request import TurnRequest
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import server_context
from kimiaudio.server.middleware.draining import shutting_down
from kimiaudio.server.observe.request_log import client_closed

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.05
CUT_BY_SHUTDOWN = web.RequestKey("cut_by_shutdown", bool)  # set on a request whose turn the drain cut


def client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


@contextlib.asynccontextmanager
async def guarded_turn(request: web.Request, pipeline, turn: TurnRequest):
    """Submit `turn`; yields its TurnHandle, cancelled on disconnect, early exit or the end of a
    shutdown's grace."""
    answers = server_context(request).answers
    if answers.is_closed:  # the request came in before the drain began; it has ended since
        raise shutting_down()
    try:
        handle = pipeline.submit(turn)
    except KimiAudioError as exc:  # the pipeline is not running (shutting down)
        raise ApiError(503, "unavailable", f"the turn could not be started ({exc})") from None

    async def watch() -> None:
        while handle.done is None:
            if client_gone(request):
                log.info("client of %s went away: cancelling %s", request.path, handle.turn_id)
                pipeline.cancel(handle)
                return
            await asyncio.sleep(WATCH_INTERVAL_S)

    def cut() -> None:
        log.info("stopping: the shutdown grace has ended, cutting %s of %s", handle.turn_id, request.path)
        request[CUT_BY_SHUTDOWN] = True
        pipeline.cancel(handle)

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        with answers.counted(cut):
            yield handle
    finally:
        watcher.cancel()
        if handle.done is None:
            pipeline.cancel(handle)


def failed_turn_error(request: web.Request, done: TurnDone | None, code: str, what: str, param: str | None) -> ApiError:
    """The error of a turn that did not complete: 400 with its TurnDone.error_code when
    the request was at fault (`param` names the field to change), 503 `shutting_down` once a
    shutdown's grace has ended (the turn was cut there), `client_closed` (never sent) when it was
    cancelled because its client went away, else 500 `code`."""
    error = done.error or done.status if done is not None else "the turn ended without a result"
    if done is not None and done.error_code is not None:
        return ApiError(400, done.error_code, f"{what} failed ({error})", param=param)
    if request.get(CUT_BY_SHUTDOWN):
        return shutting_down()
    if (done is None or done.status == "cancelled") and client_gone(request):
        return client_closed()
    return ApiError(500, code, f"{what} failed ({error})")


async def once_started(
    request: web.Request, handle, code: str, what: str, param: str | None
) -> AsyncIterator[PipelineEvent]:
    """The turn's events from the start, once the first has come (the user's speech encoded,
    which the pipeline sends once the engine took the prompt, or the first output, or the end):
    raises failed_turn_error(...) if the turn ended before anything else."""
    first = await anext(handle, None)
    if first is None or (isinstance(first, TurnDone) and first.status != "completed"):
        raise failed_turn_error(request, first, code, what, param)

    async def events() -> AsyncIterator[PipelineEvent]:
        yield first
        if not isinstance(first, TurnDone):
            async for event in handle:
                yield event

    return events()
