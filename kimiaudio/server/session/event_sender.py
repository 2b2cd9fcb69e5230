"""A session's events out: counted, logged, shaped, numbered, then handed to its transport.

Every server event a session sends goes through its EventSender, whatever the transport: it
is counted in the server's metrics (response.done: status and commit -> first packet; error:
its code), a response.done is logged as one `turn` line (observe/turn_log.py), both from the
event as built (GA names); then the connection's EventShape names and shapes it (GA or beta,
event_shape.py) or leaves it out, it gets its `event_id` (evt_1, evt_2, ... per session), and
the transport's `send` carries it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from kimiaudio.server.observe.server_metrics import ServerMetrics
from kimiaudio.server.observe.turn_log import log_response
from kimiaudio.server.session import server_events
from kimiaudio.server.session.event_shape import EventShape


class EventSender:
    def __init__(
        self,
        session_id: str,
        conversation_id: Callable[[], str | None],
        send: Callable[[dict[str, Any]], None],
        metrics: ServerMetrics | None = None,
        shape: EventShape | None = None,
    ):
        """conversation_id: the id of the conversation the session talks in now (for the log);
        shape: the connection's (None: GA, not over WebRTC)."""
        self.session_id = session_id
        self._conversation_id = conversation_id
        self._send = send
        self._metrics = metrics
        self.shape = shape if shape is not None else EventShape()
        self._numbers = itertools.count(1)

    def send(self, event: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._metrics.observe_event(event)
        if event["type"] == "response.done":
            log_response(self.session_id, self._conversation_id(), event)
        shaped = self.shape.event(event)
        if shaped is not None:
            self._send({"event_id": f"evt_{next(self._numbers)}", **shaped})

    def error(self, code: str, message: str, param: str | None = None, event_id: str | None = None) -> None:
        """An `error` event (server_events.error); event_id: the client event at fault."""
        self.send(server_events.error(code, message, param, event_id))
