"""The JSON event protocol spoken on the WebRTC data channel.

One JSON object per message, each with a "type". Names follow the OpenAI Realtime API where
a matching event exists. Server -> client events are built by the functions below (so every
field name is written in one place); client -> server events are parsed and validated by
`parse_client_event`, which raises ProtocolError (code + message, sent back as an `error`
event) for anything malformed.

Server events: session.created, session.updated, input_audio_buffer.speech_started,
input_audio_buffer.speech_stopped, input_audio_buffer.committed, conversation.created,
conversation.item.created, response.created, response.text.delta, response.audio.started,
response.done, error.
Client events: session.update, response.cancel, conversation.select.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from kimiaudio.config import check_setting
from kimiaudio.errors import ConfigError, KimiAudioError

RESPONSE_STATUSES = ("completed", "cancelled", "failed")
MAX_CLIENT_MESSAGE_BYTES = 64 * 1024


class ProtocolError(KimiAudioError):
    """A client event that cannot be used; `code` is machine-readable, the message is not."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class EventIds:
    """Numbers the events of one session: evt_1, evt_2, ..."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def stamp(self, event: dict[str, Any]) -> dict[str, Any]:
        return {"event_id": f"evt_{next(self._counter)}", **event}


# ----- server -> client -----
def session_created(session_id: str, conversation_id: str | None, settings: dict[str, Any]) -> dict:
    return {"type": "session.created", "session": {"id": session_id, "conversation_id": conversation_id, **settings}}


def session_updated(session_id: str, conversation_id: str | None, settings: dict[str, Any]) -> dict:
    return {"type": "session.updated", "session": {"id": session_id, "conversation_id": conversation_id, **settings}}


def speech_started(audio_start_ms: int) -> dict:
    return {"type": "input_audio_buffer.speech_started", "audio_start_ms": audio_start_ms}


def speech_stopped(audio_end_ms: int) -> dict:
    return {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": audio_end_ms}


def committed(conversation_id: str, item_index: int, duration_s: float) -> dict:
    return {
        "type": "input_audio_buffer.committed",
        "conversation_id": conversation_id,
        "item_index": item_index,
        "duration_s": round(duration_s, 3),
    }


def conversation_created(conversation_id: str) -> dict:
    return {"type": "conversation.created", "conversation": {"id": conversation_id}}


def item_created(conversation_id: str, item: dict[str, Any]) -> dict:
    """`item`: index, role, text, interrupted, has_audio (as GET /api/conversations/{id} lists turns)."""
    return {"type": "conversation.item.created", "conversation_id": conversation_id, "item": item}


def response_created(response_id: str, conversation_id: str) -> dict:
    return {"type": "response.created", "response": {"id": response_id, "conversation_id": conversation_id}}


def text_delta(response_id: str, delta: str) -> dict:
    return {"type": "response.text.delta", "response_id": response_id, "delta": delta}


def audio_started(response_id: str) -> dict:
    return {"type": "response.audio.started", "response_id": response_id}


def response_done(
    response_id: str, status: str, text: str, timings: dict[str, float], error: str | None = None, **extra: Any
) -> dict:
    if status not in RESPONSE_STATUSES:
        raise ValueError(f"response status must be one of {RESPONSE_STATUSES}, got {status!r}")
    response = {"id": response_id, "status": status, "text": text, "timings": timings, **extra}
    if error:
        response["error"] = error
    return {"type": "response.done", "response": response}


def error(code: str, message: str) -> dict:
    return {"type": "error", "error": {"code": code, "message": message}}


# ----- client -> server -----
@dataclass(frozen=True)
class SessionUpdate:
    vad: dict[str, Any] = field(default_factory=dict)  # keys of config [vad]
    sampling: dict[str, Any] = field(default_factory=dict)  # keys of config [sampling]
    output_type: str | None = None  # "both" | "text"


@dataclass(frozen=True)
class ResponseCancel:
    pass


@dataclass(frozen=True)
class ConversationSelect:
    conversation_id: str | None  # None = start a new conversation


ClientEvent = SessionUpdate | ResponseCancel | ConversationSelect
CLIENT_EVENT_TYPES = ("session.update", "response.cancel", "conversation.select")


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError("invalid_event", f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _only(obj: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise ProtocolError("invalid_event", f"{where}: unknown field(s) {', '.join(unknown)} (allowed: {', '.join(allowed)})")


def parse_client_event(message: str | bytes) -> ClientEvent:
    """Validate one data-channel message; raises ProtocolError saying what was wrong."""
    if isinstance(message, bytes):
        if len(message) > MAX_CLIENT_MESSAGE_BYTES:
            raise ProtocolError("invalid_event", f"message too large ({len(message)} bytes, limit {MAX_CLIENT_MESSAGE_BYTES})")
        try:
            message = message.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("invalid_json", "message is not UTF-8 text") from None
    if len(message) > MAX_CLIENT_MESSAGE_BYTES:
        raise ProtocolError("invalid_event", f"message too large ({len(message)} characters, limit {MAX_CLIENT_MESSAGE_BYTES})")
    try:
        data = json.loads(message)
    except (ValueError, RecursionError) as exc:  # RecursionError: arrays nested thousands deep
        raise ProtocolError("invalid_json", f"message is not valid JSON ({exc})") from None
    data = _object(data, "event")
    kind = data.get("type")
    if kind not in CLIENT_EVENT_TYPES:
        raise ProtocolError("unknown_event", f"unknown event type {kind!r} (expected one of: {', '.join(CLIENT_EVENT_TYPES)})")
    if kind == "response.cancel":
        _only(data, ("type", "event_id", "response_id"), kind)
        return ResponseCancel()
    if kind == "conversation.select":
        _only(data, ("type", "event_id", "conversation_id"), kind)
        conversation_id = data.get("conversation_id")
        if conversation_id is not None and (not isinstance(conversation_id, str) or not conversation_id):
            raise ProtocolError("invalid_event", f"{kind}: conversation_id must be a non-empty string or null")
        return ConversationSelect(conversation_id)
    _only(data, ("type", "event_id", "session"), kind)
    session = _object(data.get("session", {}), f"{kind}.session")
    _only(session, ("vad", "sampling", "output_type"), f"{kind}.session")
    output_type = session.get("output_type")
    if output_type is not None and output_type not in ("both", "text"):
        raise ProtocolError("invalid_event", f"{kind}.session.output_type: expected 'both' or 'text', got {output_type!r}")
    return SessionUpdate(
        vad=_settings(session.get("vad", {}), "vad", f"{kind}.session"),
        sampling=_settings(session.get("sampling", {}), "sampling", f"{kind}.session"),
        output_type=output_type,
    )


def _settings(value: Any, section: str, where: str) -> dict[str, Any]:
    """Keys of config [section], each checked against its declared type and range here, so a
    bad value is answered at once instead of failing a turn later."""
    try:
        return {key: check_setting(section, key, item) for key, item in _object(value, f"{where}.{section}").items()}
    except ConfigError as exc:
        raise ProtocolError("invalid_value", f"{where}.{exc}") from None
