"""The `error` a WebRTC session sends instead of an event too large for its data channel (the
peer's max-message-size): a retrieved item with its audio is the one that can be."""

from __future__ import annotations

from kimiaudio.server.session import server_events


def too_large_error(event: dict, size: int, limit: str) -> dict:
    """The `error` event_too_large sent instead of `event` (`size` bytes of JSON; `limit`: the
    channel's refusal, naming its max-message-size). It names the client event that `event`
    answers (its `client_event_id`, if it has one) and, for a retrieved item with stored audio,
    where that audio is (its `conversation_id` and the item's `index`): an answer still in
    progress has its audio there once it has ended."""
    message = f"{event['type']} was not sent: {size} bytes is more than this data channel takes ({limit})"
    if event["type"] == "conversation.item.retrieved":
        item, conversation_id = event["item"], event.get("conversation_id")
        if item.get("has_audio") and item.get("index") is not None and conversation_id is not None:
            path = f"GET /api/conversations/{conversation_id}/turns/{item['index']}/audio"
            if item.get("status") == "in_progress":
                message += f"; the answer is in progress: its audio will be at {path} once it has ended"
            else:
                message += f"; its audio is at {path}"
    return server_events.error("event_too_large", message, event_id=event.get("client_event_id"))
