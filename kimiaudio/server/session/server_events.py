"""Server -> client events of the real-time protocol (WebRTC data channel and /v1/realtime).

One JSON object per message, each with a "type". Names and fields follow the OpenAI Realtime
API (beta shape, what `client.beta.realtime.connect()` parses) where a matching event exists;
kimiaudio adds fields of its own beside them (conversation_id, item index, timings...), which
OpenAI clients ignore. Every field name is written here once. Client events are parsed in
client_events.py; a session's events go out through its EventSender (event_sender.py).

Server events: session.created, session.updated, input_audio_buffer.speech_started,
input_audio_buffer.speech_stopped, input_audio_buffer.committed, input_audio_buffer.cleared,
conversation.created, conversation.item.created, conversation.item.truncated,
conversation.item.input_audio_transcription.completed / .failed,
response.created, response.output_item.added, response.text.delta,
response.audio_transcript.delta, response.audio.delta, response.audio.started (kimiaudio:
the first audio was played), response.audio.done, response.audio_transcript.done,
response.text.done, response.output_item.done, response.done, error.
"""

from __future__ import annotations

from typing import Any

from kimiaudio.server import api_error

RESPONSE_STATUSES = ("completed", "cancelled", "failed")


# ----- session -----
def session_created(session: dict[str, Any]) -> dict:
    """`session`: RealtimeSession.describe() (OpenAI's session fields and kimiaudio's)."""
    return {"type": "session.created", "session": session}


def session_updated(session: dict[str, Any]) -> dict:
    return {"type": "session.updated", "session": session}


# ----- input audio -----
def speech_started(audio_start_ms: int, item_id: str) -> dict:
    return {"type": "input_audio_buffer.speech_started", "audio_start_ms": audio_start_ms, "item_id": item_id}


def speech_stopped(audio_end_ms: int, item_id: str) -> dict:
    return {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": audio_end_ms, "item_id": item_id}


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
) -> dict:
    """A conversation item as OpenAI describes a message, plus kimiaudio's fields (index, role,
    text, interrupted, has_audio: as GET /api/conversations/{id} lists turns)."""
    if role == "user":
        content = ([{"type": "input_text", "text": text}] if text else []) + (
            [{"type": "input_audio", "transcript": None}] if has_audio else []
        )
    elif has_audio:
        content = [{"type": "audio", "transcript": text}]
    else:
        content = [{"type": "text", "text": text}]
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


def item_created(conversation_id: str, item: dict[str, Any], previous_item_id: str | None = None) -> dict:
    return {
        "type": "conversation.item.created",
        "conversation_id": conversation_id,
        "previous_item_id": previous_item_id,
        "item": item,
    }


def item_truncated(item_id: str, audio_end_ms: int) -> dict:
    return {"type": "conversation.item.truncated", "item_id": item_id, "content_index": 0, "audio_end_ms": audio_end_ms}


def transcription_completed(item_id: str, content_index: int, transcript: str, seconds: float) -> dict:
    """The user's words of a committed audio item (OpenAI's event, with usage by duration)."""
    return {
        "type": "conversation.item.input_audio_transcription.completed",
        "item_id": item_id,
        "content_index": content_index,
        "transcript": transcript,
        "usage": {"type": "duration", "seconds": round(seconds, 3)},
    }


def transcription_failed(item_id: str, content_index: int, message: str) -> dict:
    return {
        "type": "conversation.item.input_audio_transcription.failed",
        "item_id": item_id,
        "content_index": content_index,
        "error": {"type": "transcription_error", "code": "transcription_failed", "message": message, "param": None},
    }


# ----- responses -----
def response_created(response_id: str, conversation_id: str | None) -> dict:
    return {
        "type": "response.created",
        "response": {
            "id": response_id,
            "object": "realtime.response",
            "status": "in_progress",
            "output": [],
            "conversation_id": conversation_id,
        },
    }


def output_item_added(response_id: str, item: dict[str, Any]) -> dict:
    return {"type": "response.output_item.added", "response_id": response_id, "output_index": 0, "item": item}


def output_item_done(response_id: str, item: dict[str, Any]) -> dict:
    return {"type": "response.output_item.done", "response_id": response_id, "output_index": 0, "item": item}


def _part(kind: str, response_id: str, item_id: str, **fields: Any) -> dict:
    return {
        "type": kind,
        "response_id": response_id,
        "item_id": item_id,
        "output_index": 0,
        "content_index": 0,
        **fields,
    }


def text_delta(response_id: str, item_id: str, delta: str) -> dict:
    """Text of a text-only answer."""
    return _part("response.text.delta", response_id, item_id, delta=delta)


def transcript_delta(response_id: str, item_id: str, delta: str) -> dict:
    """Text of a spoken answer (its transcript, generated beside the speech)."""
    return _part("response.audio_transcript.delta", response_id, item_id, delta=delta)


def audio_delta(response_id: str, item_id: str, audio_base64: str) -> dict:
    return _part("response.audio.delta", response_id, item_id, delta=audio_base64)


def audio_started(response_id: str) -> dict:
    return {"type": "response.audio.started", "response_id": response_id}


def text_done(response_id: str, item_id: str, text: str, spoken: bool) -> list[dict]:
    """The end of a response's content: text.done, or audio.done + audio_transcript.done."""
    if not spoken:
        return [_part("response.text.done", response_id, item_id, text=text)]
    return [
        _part("response.audio.done", response_id, item_id),
        _part("response.audio_transcript.done", response_id, item_id, transcript=text),
    ]


def response_done(
    response_id: str,
    status: str,
    text: str,
    timings: dict[str, float],
    error: str | None = None,
    output: list[dict] | None = None,
    reason: str | None = None,
    error_code: str | None = None,
    **extra: Any,
) -> dict:
    """error_code: a failure that was the request's fault (TurnDone.error_code), named as OpenAI does."""
    if status not in RESPONSE_STATUSES:
        raise ValueError(f"response status must be one of {RESPONSE_STATUSES}, got {status!r}")
    response = {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "output": output or [],
        "text": text,
        "timings": timings,
        **extra,
    }
    if status != "completed":
        response["status_details"] = {
            "type": status,
            "reason": reason or status,
            **({"error": {"message": error, **_client_fault(error_code)}} if error else {}),
        }
    if error:
        response["error"] = error
    return {"type": "response.done", "response": response}


def _client_fault(code: str | None) -> dict:
    return {"type": api_error.INVALID_REQUEST, "code": code} if code is not None else {}


SERVER_FAULTS = ("turn_failed", "storage_failed", "response_failed", "internal")


def error(code: str, message: str, param: str | None = None, event_id: str | None = None) -> dict:
    """The server's error object (api_error.py) as OpenAI's Realtime sends it: in an `error`
    event, naming the client event at fault (`event_id`, None when none is known)."""
    kind = api_error.SERVER_ERROR if code in SERVER_FAULTS else api_error.INVALID_REQUEST
    return api_error.error_event({**api_error.error_object(message, kind, param, code), "event_id": event_id})


def response_usage(done) -> dict:
    """OpenAI's response usage of a TurnDone: prompt positions in, generated positions out."""
    prompt = done.prefill_tokens_computed + done.prefill_tokens_cached
    return {
        "total_tokens": prompt + len(done.text_tokens),
        "input_tokens": prompt,
        "output_tokens": len(done.text_tokens),
        "input_token_details": {"cached_tokens": done.prefill_tokens_cached},
    }
