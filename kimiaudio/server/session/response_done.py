"""The end of a Realtime response as its client is told of it (responder.py runs the response):
its answer item as the item events carry it, and the last events, in OpenAI's order (its
content's end, its item's, response.done, and the end of its playback).

What the client was sent is what these events report, all of the text generated included: a
cut answer's transcript is not taken back, as OpenAI does not take it back. What was heard of it
is what the conversation keeps (answer_storage.py).
"""

from __future__ import annotations

from kimiaudio.pipeline.events import TurnDone
from kimiaudio.server.session import response_events, server_events
from kimiaudio.server.session.event_sender import EventSender
from kimiaudio.server.session.response_state import ResponseState


def answer_item(response: ResponseState, status: str = "completed", index: int | None = None) -> dict:
    """The response's assistant item (`index`: its stored turn's, once stored)."""
    spoken = response.output_type == "both"
    return server_events.message_item(
        response.item_id, "assistant", response.text, spoken, index, response.cancelled, status
    )


def final_status(cancelled: bool, done: TurnDone) -> str:
    """A response's status in response.done: cancelled, or what the pipeline reported of it
    (an answer cut by its length limit is incomplete)."""
    status = "cancelled" if cancelled else done.status
    if status == "completed" and done.finish_reason == "length":
        return "incomplete"
    return status


SHUTDOWN_CUT = "the server is shutting down: the answer was cut (what was heard is stored)"


def send_done(events: EventSender, conversation_id: str | None, response: ResponseState, done: TurnDone) -> None:
    """The response's last events, `done` being what the pipeline reported of it (an answer cut
    by the server's stop is cancelled with no client's reason, and an error saying why)."""
    status = final_status(response.cancelled, done)
    error, error_code = done.error, done.error_code
    if response.cancel_reason == "shutting_down":
        error, error_code = SHUTDOWN_CUT, "shutting_down"
    text = response.text or done.text
    spoken = response.output_type == "both"
    for event in response_events.text_done(response.id, response.item_id, text, spoken):
        events.send(event)
    events.send(response_events.content_part_done(response.id, response.item_id, spoken, text))
    ended = "completed" if status == "completed" else "incomplete"
    item = answer_item(response, ended, response.stored[0] if response.stored else None)
    events.send(response_events.output_item_done(response.id, item))
    events.send(server_events.item_done(conversation_id, item, response.previous_item_id))
    events.send(
        response_events.response_done(
            response.announced,
            status,
            text,
            response.timings(done),
            error,
            output=[item],
            reason=response.cancel_reason,
            error_code=error_code,
            prefill_tokens_cached=done.prefill_tokens_cached,
            prefill_tokens_computed=done.prefill_tokens_computed,
            usage=response_events.response_usage(done),
        )
    )
    if response.first_played_at is not None and not response.playback_cut:
        events.send(response_events.audio_buffer("stopped", response.id))
