"""Server -> client events of the real-time protocol: the session, the input audio, the
conversation's items, the user's words and errors (a response's own events:
response_events.py).

Built in the OpenAI Realtime API's GA names and shapes; a connection speaking the beta shape
gets them renamed and reshaped by its EventShape (event_shape.py), the one place that tells
the shapes apart. kimiaudio adds fields of its own beside OpenAI's (conversation_id, item
index, duration_s...), which OpenAI's clients keep without reading. Every field name is written
here once. Client events are parsed in client_events.py; a session's events go out through
its EventSender (event_sender.py).

Events: session.created, session.updated, input_audio_buffer.speech_started / .speech_stopped
/ .committed / .cleared, conversation.created, conversation.item.added / .done / .truncated /
.retrieved / .deleted, conversation.item.input_audio_transcription.delta / .completed /
.failed, error.
"""

from __future__ import annotations

from typing import Any

from kimiaudio.server import api_error


# ----- session -----
def session_created(session: dict[str, Any]) -> dict:
    """`session`: the session object in the connection's shape (session_objects.py)."""
    return {"type": "session.created", "session": session}


def session_updated(session: dict[str, Any]) -> dict:
    return {"type": "session.updated", "session": session}


# ----- input audio -----
def speech_started(audio_start_ms: int, item_id: str) -> dict:
    return {"type": "input_audio_buffer.speech_started", "audio_start_ms": audio_start_ms, "item_id": item_id}


def speech_stopped(audio_end_ms: int, item_id: str) -> dict:
    return {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": audio_end_ms, "item_id": item_id}


def idle_timeout(audio_start_ms: int, audio_end_ms: int, item_id: str) -> dict:
    """The silence after an answer lasted idle_timeout_ms: its audio is committed as `item_id`."""
    return {
        "type": "input_audio_buffer.timeout_triggered",
        "audio_start_ms": audio_start_ms,
        "audio_end_ms": audio_end_ms,
        "item_id": item_id,
    }


def committed(
    conversation_id: str, item_index: int, duration_s: float, item_id: str, previous_item_id: str | None
) -> dict:
    return {
        "type": "input_audio_buffer.committed",
        "item_id": item_id,
        "previous_item_id": previous_item_id,
        "conversation_id": conversation_id,
        "item_index": item_index,
        "duration_s": round(duration_s, 3),
    }


def buffer_cleared() -> dict:
    return {"type": "input_audio_buffer.cleared"}


# ----- conversation items -----
def conversation_created(conversation_id: str) -> dict:
    return {"type": "conversation.created", "conversation": {"id": conversation_id, "object": "realtime.conversation"}}


def message_item(
    item_id: str,
    role: str,
    text: str = "",
    has_audio: bool = False,
    index: int | None = None,
    interrupted: bool = False,
    status: str = "completed",
    audio_first: bool = False,
) -> dict:
    """A conversation item as OpenAI describes a message, plus kimiaudio's fields (index, text,
    interrupted, has_audio: as GET /api/conversations/{id} lists turns). An assistant item in
    progress has no content yet; a user item's parts are in the client's order (audio_first:
    its text came after its audio)."""
    if role in ("user", "system"):
        parts = ([{"type": "input_text", "text": text}] if text else []) + (
            [{"type": "input_audio", "transcript": None}] if has_audio else []
        )
        content = parts[::-1] if audio_first else parts
    elif status == "in_progress":
        content = []
    elif has_audio:
        content = [{"type": "output_audio", "transcript": text}]
    else:
        content = [{"type": "output_text", "text": text}]
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": role,
        "status": status,
        "content": content,
        "index": index,
        "text": text,
        "interrupted": interrupted,
        "has_audio": has_audio,
    }


def item_added(conversation_id: str | None, item: dict[str, Any], previous_item_id: str | None) -> dict:
    """An item entered the conversation (an assistant's while it is generated)."""
    return {
        "type": "conversation.item.added",
        "conversation_id": conversation_id,
        "previous_item_id": previous_item_id,
        "item": item,
    }


def item_done(conversation_id: str | None, item: dict[str, Any], previous_item_id: str | None) -> dict:
    """An item is final (a user's at once; an assistant's when its response ends)."""
    return {**item_added(conversation_id, item, previous_item_id), "type": "conversation.item.done"}


def item_truncated(item_id: str, audio_end_ms: int) -> dict:
    return {"type": "conversation.item.truncated", "item_id": item_id, "content_index": 0, "audio_end_ms": audio_end_ms}


def item_retrieved(item: dict[str, Any], conversation_id: str | None, client_event_id: str | None) -> dict:
    """The item as the server holds it, its audio included, in conversation `conversation_id`,
    answering the conversation.item.retrieve whose event_id is `client_event_id` (None: it had
    none). Over WebRTC, one too large for the data channel becomes an `error` naming that
    event_id and where the item's audio is (transport/rtc_peer.py)."""
    return {
        "type": "conversation.item.retrieved",
        "conversation_id": conversation_id,
        "client_event_id": client_event_id,
        "item": item,
    }


def item_deleted(item_id: str) -> dict:
    return {"type": "conversation.item.deleted", "item_id": item_id}


# ----- the user's words -----
def transcription_delta(item_id: str, content_index: int, delta: str, logprobs: list[dict] | None = None) -> dict:
    """`logprobs`: its tokens' (token_logprobs.py), where the session's `include` asks for them."""
    return {
        "type": "conversation.item.input_audio_transcription.delta",
        "item_id": item_id,
        "content_index": content_index,
        "delta": delta,
        **({"logprobs": logprobs} if logprobs is not None else {}),
    }


def transcription_completed(
    item_id: str, content_index: int, transcript: str, seconds: float, logprobs: list[dict] | None = None
) -> dict:
    """The user's words of a committed audio item (OpenAI's event, with usage by duration)."""
    return {
        "type": "conversation.item.input_audio_transcription.completed",
        "item_id": item_id,
        "content_index": content_index,
        "transcript": transcript,
        "usage": {"type": "duration", "seconds": round(seconds, 3)},
        **({"logprobs": logprobs} if logprobs is not None else {}),
    }


def transcription_failed(item_id: str, content_index: int, message: str) -> dict:
    return {
        "type": "conversation.item.input_audio_transcription.failed",
        "item_id": item_id,
        "content_index": content_index,
        "error": {"type": "transcription_error", "code": "transcription_failed", "message": message, "param": None},
    }


# ----- errors -----
SERVER_FAULTS = ("turn_failed", "storage_failed", "response_failed", "internal", "shutting_down")


def error(code: str, message: str, param: str | None = None, event_id: str | None = None) -> dict:
    """The server's error object (api_error.py) as OpenAI's Realtime sends it: in an `error`
    event, naming the client event at fault (`event_id`, None when none is known)."""
    kind = api_error.SERVER_ERROR if code in SERVER_FAULTS else api_error.INVALID_REQUEST
    return api_error.error_event({**api_error.error_object(message, kind, param, code), "event_id": event_id})
