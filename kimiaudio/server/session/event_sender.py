"""A session's events out: numbered, counted, logged, then handed to its transport.

Every server event a session sends goes through its EventSender, whatever the transport: it
gets its `event_id` (evt_1, evt_2, ... per session), is counted in the server's metrics
(response.done: status and commit -> first packet; error: its code), and a response.done is
logged as one `turn` line (observe/turn_log.py); then the transport's `send` carries it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from kimiaudio.server.observe.server_metrics import ServerMetrics
from kimiaudio.server.observe.turn_log import log_response
from kimiaudio.server.session import server_events


class EventSender:
    def __init__(
        self,
        session_id: str,
        conversation_id: Callable[[], str | None],
        send: Callable[[dict[str, Any]], None],
        metrics: ServerMetrics | None = None,
    ):
        """conversation_id: the id of the conversation the session talks in now (for the log)."""
        self.session_id = session_id
        self._conversation_id = conversation_id
        self._send = send
        self._metrics = metrics
        self._numbers = itertools.count(1)

    def send(self, event: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._metrics.observe_event(event)
        if event["type"] == "response.done":
            log_response(self.session_id, self._conversation_id(), event)
        self._send({"event_id": f"evt_{next(self._numbers)}", **event})

    def error(self, code: str, message: str, param: str | None = None) -> None:
        """An `error` event (server_events.error)."""
        self.send(server_events.error(code, message, param))
