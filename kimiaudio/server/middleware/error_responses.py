"""The middlewares that make every failure of a request an ApiError (server/api_error.py).

Every error is JSON `{"error": {"message", "type", "param", "code"}}` (OpenAI's error object,
for the /v1 routes and the app's own alike) with a 4xx/5xx status and a plain message. Bad
input is refused where it enters (body_limits.py, inputs/, the routes' path values, the /v1
parsers) with an ApiError or a KimiAudioError (-> 400). Mapped here only: client JSON that is
too large -> 413, a body that cannot be read (not in its Content-Encoding) -> 400. A
conversation no longer stored (deleted while a session opened it) is 404, one another session
holds 409, and a database that does not answer 503, the last two with Retry-After; anything
else that escapes a handler is a bug, logged once with its traceback and answered with a 500
that names no internal exception.
A client that hangs up mid-request is one INFO line, not a traceback.

`error_middleware(metrics)` is the app's outermost middleware: it answers every error and
counts each one sent. `errors_as_api_errors` does the mapping; a sub-application (/v1) puts it
innermost in its own chain, so that its middlewares (the request log) see the ApiError its
client will get; the app's outermost one then finds an ApiError and only counts it.
"""

from __future__ import annotations

import logging
import math

from aiohttp import web
from aiohttp.http_exceptions import PayloadEncodingError
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_protocol import RequestPayloadError

from kimiaudio.errors import KimiAudioError, StoreUnavailableError
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.inputs.json_input import JsonInputError
from kimiaudio.server.observe.log_values import log_value
from kimiaudio.server.observe.request_log import client_closed, request_record
from kimiaudio.server.observe.server_metrics import ServerMetrics
from kimiaudio.store import ConversationBusyError, ConversationNotFoundError

log = logging.getLogger(__name__)


INTERNAL_MESSAGE = "internal server error (the details are in the server log)"
DATABASE_RETRY_AFTER_S = 5  # what a client waits before trying a request the database refused


def _is_page(path: str) -> bool:
    """The demo page and its files keep aiohttp's plain answers; everything else speaks JSON."""
    return path == "/" or path.startswith("/static/")


def error_middleware(metrics: ServerMetrics) -> Middleware:
    """The outermost middleware: every error leaves as JSON (or the page's plain answer), and
    each one sent is counted in `metrics`: an error status, or the `error` event that ended a
    /v1 stream after its 200 (its request record's `failed`)."""

    @web.middleware
    async def answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await errors_as_api_errors(request, handler)
        except ApiError as exc:
            metrics.note_error("http", exc.code)
            raise
        failed = request_record(request).failed
        if failed is not None:
            metrics.note_error("stream", failed)
        return response

    return answer_errors


@web.middleware
async def errors_as_api_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure of `handler` as the ApiError the client gets."""
    try:
        return await handler(request)
    except ApiError:
        raise
    except web.HTTPException as exc:
        if exc.content_type == "application/json" or _is_page(request.path) or exc.status < 400:
            raise
        if exc.status == 413:  # aiohttp's text says the limit and the size
            raise ApiError(413, "too_large", f"the request body is too large ({exc.text})") from None
        code = exc.reason.lower().replace(" ", "_")
        raise ApiError(exc.status, code, exc.reason, headers=_kept_headers(exc)) from None
    except JsonInputError as exc:
        status = 413 if exc.code == "too_large" else 400
        raise ApiError(status, exc.code, str(exc)) from None
    except (RequestPayloadError, PayloadEncodingError) as exc:  # e.g. a body not in its Content-Encoding
        raise _unreadable_body(request, exc) from None
    except ConversationNotFoundError as exc:  # e.g. deleted while a session was opening it
        raise ApiError(404, exc.code, str(exc)) from None
    except ConversationBusyError as exc:
        raise ApiError(409, exc.code, str(exc), headers={"Retry-After": str(math.ceil(exc.retry_after_s))}) from None
    except StoreUnavailableError as exc:
        raise ApiError(
            503, "database_unavailable", str(exc), headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)}
        ) from None
    except KimiAudioError as exc:
        raise ApiError(400, getattr(exc, "code", None) or "bad_request", str(exc)) from None
    except ConnectionResetError:  # the client went away; there is nobody to answer
        log.info("client hung up during %s %s", request.method, log_value(request.path))
        raise client_closed() from None
    except Exception:
        log.exception("unexpected error in %s %s", request.method, log_value(request.path))
        raise ApiError(500, "internal", INTERNAL_MESSAGE) from None


def _unreadable_body(request: web.Request, exc: Exception) -> ApiError:
    """The 400 for a body that cannot be read. Its rest never will be: the connection closes
    after the answer, and aiohttp is told the body has ended, as it would otherwise read the rest
    before the next request (its lingering close) and fail the same way again, logged as an
    unhandled exception with a traceback."""
    request.content.feed_eof()
    error = ApiError(400, "invalid_body", f"the request body could not be read: {exc}")
    error.force_close()
    return error


def _kept_headers(exc: web.HTTPException) -> dict:
    # 405 must keep Allow; others (Retry-After...) are set by our own ApiErrors already.
    return {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After", "WWW-Authenticate")}
