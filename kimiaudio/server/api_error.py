"""The server's one error type and the one builder of the error object every surface sends.

Every error a client sees holds OpenAI's error object, its fields in OpenAI's order:
`{"message", "type", "param", "code"}` (`error_object`). Where it is sent:
- an HTTP answer (/api, /v1): the body `{"error": {...}}` with a 4xx/5xx status (ApiError,
  raised by a handler or made by the error middleware, middleware/error_responses.py);
- a server-sent event stream whose status line is sent already (/v1 streaming), and the
  Realtime events (WebRTC data channel, /v1/realtime): the event
  `{"type": "error", "event_id"?, "error": {...}}` (`error_event`), as OpenAI's Realtime API
  sends it; a Realtime error's object also names the client event at fault (`event_id`).
"""

from __future__ import annotations

import json

from aiohttp import web

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


def error_object(message: str, type: str, param: str | None, code: str | None) -> dict:
    """OpenAI's error object; every error body and event of the server holds one built here."""
    return {"message": message, "type": type, "param": param, "code": code}


def error_event(error: dict, event_id: str | None = None) -> dict:
    """An `error` event (Realtime, server-sent events) around `error`, an `error_object`."""
    return {"type": "error", **({"event_id": event_id} if event_id is not None else {}), "error": error}


class ApiError(web.HTTPException):
    """An error for a client: its HTTP status (when answered over HTTP), machine-readable `code`,
    plain `message`, the request field at fault (`param`) and OpenAI's error `type`, which
    follows the status unless given. Raised in a handler it is the JSON answer (`json_body()`);
    `event()` is the same error in a stream. (`body` is aiohttp's: the bytes sent.)"""

    def __init__(
        self,
        status: int,
        code: str | None,
        message: str,
        *,
        param: str | None = None,
        type: str | None = None,
        headers: dict | None = None,
    ):
        self.status_code = status
        self.code, self.message, self.param = code, message, param
        self.type = type or (SERVER_ERROR if status >= 500 else INVALID_REQUEST)
        super().__init__(headers=headers, text=json.dumps(self.json_body()), content_type="application/json")

    def error(self) -> dict:
        return error_object(self.message, self.type, self.param, self.code)

    def json_body(self) -> dict:
        """The JSON body of an HTTP answer."""
        return {"error": self.error()}

    def event(self, event_id: str | None = None) -> dict:
        """The `error` event of a stream whose status line is sent already."""
        return error_event(self.error(), event_id)
