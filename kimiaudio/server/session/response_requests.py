"""A session's response.create and response.cancel events, and the one case that joins them: a
cancel that comes while its response has not started yet (queued behind other items, or being
built), which ends that response as it starts (created, then done, cancelled). So does a
barge-in heard while it waited (`turn_detected`): OpenAI starts a response.create at once, and
the speech that began after it cuts it in progress (interrupt_response), so it never plays over
the user.

response.create is queued (`queued`), in order with the items, with the session's settings as
they were when it came (a session.update sent after it is for the responses after it), and
started when taken (`start`): the conversation's own by the Responder, an out-of-band one
(conversation "none") by OutOfBand. response.cancel is answered at once (`cancel`): one naming
an out-of-band response cancels it; else the conversation's response in progress is cut (one
already cut, by a truncate or a barge-in, is left as it is: it ends with its response.done);
with none, a response.create still waiting counts it; after a truncate cut the last one, it
asks for what is done; with none of these, it is an error (response_cancel_not_active), as
OpenAI answers it, unless it only stops the playback.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kimiaudio.server.session.client_events import ResponseCreate
from kimiaudio.server.session.event_fields import ProtocolError
from kimiaudio.server.session.out_of_band import OutOfBand
from kimiaudio.server.session.queued_turn import QueuedResponse
from kimiaudio.server.session.responder import Responder
from kimiaudio.server.session.session_settings import SessionSettings


class ResponseRequests:
    def __init__(self, responder: Responder, out_of_band: OutOfBand, barge_ins: Callable[[], int]):
        """barge_ins: the session's count of speech_started events that interrupted."""
        self._responder = responder
        self._barge_ins = barge_ins
        self._out_of_band = out_of_band
        self._waiting = 0  # response.create events queued or starting, not yet a response
        self._cancels = 0  # response.cancel events that found only those: such a response ends as it starts

    def queued(self, request: ResponseCreate, settings: SessionSettings, event_id: str | None) -> QueuedResponse:
        """The queue's entry for a response.create; `settings`: the session's as it came."""
        if not request.out_of_band:  # (nothing cancels it but its id)
            self._waiting += 1
        return QueuedResponse(request, settings, self._cancels, self._barge_ins(), event_id)

    async def start(self, work: QueuedResponse) -> None:
        if work.request.out_of_band:
            await self._out_of_band.start(work.request, work.settings, work.event_id)
            return
        before = self._responder.current
        try:
            await self._responder.start(work.request, time.monotonic(), work.event_id, work.settings)
        finally:
            self._waiting -= 1
        started = self._responder.current
        if started is None or started is before:
            return
        if work.cancels != self._cancels:
            self._responder.interrupt("client_cancelled")  # cancelled while it waited: created, then ended
        elif work.barge_ins != self._barge_ins():
            self._responder.interrupt("turn_detected")  # the user spoke up after asking: it would play over them

    def cancel(self, response_id: str | None, stop_playback: bool) -> None:
        if response_id is not None and self._out_of_band.cancel(response_id):
            return
        response = self._responder.current
        if response is not None and response_id in (None, response.id):
            # (one cut already, by a truncate or a barge-in, is still in progress until its
            # response.done: the cancel asks for what is happening)
            self._responder.interrupt("client_cancelled")
        elif self._waiting and response_id is None:
            self._cancels += 1
        elif response_id is None and self._responder.cut_by_truncate:
            pass  # (openai-agents' interrupt(): truncate, then cancel; the cut answer may have ended between)
        elif not stop_playback:
            # As OpenAI answers it: a client waiting for a response.done it will never get learns so.
            shown = f" with id {response_id[:80]!r}" if response_id is not None else ""
            raise ProtocolError(
                "response_cancel_not_active",
                f"response.cancel: no response{shown} is in progress",
                "response_id" if response_id is not None else None,
            )
