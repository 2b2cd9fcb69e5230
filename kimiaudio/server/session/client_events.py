"""Client -> server events of the real-time protocol, parsed and validated (both transports).

The WebRTC data channel and the WebSocket (GET /v1/realtime) speak the same events. They are
the OpenAI Realtime API's core, in its beta shape (what `client.beta.realtime.connect()`
sends: `session.modalities`, `input_audio_format`, `turn_detection`, ...,
`transcription_session.update`) and its GA shape (`client.realtime.connect()`:
`session.type`, `session.output_modalities`, `session.audio.input.format`,
`session.audio.input.turn_detection`, `session.audio.output.voice`, ...), whichever shape the
connection's server events take, plus kimiaudio's own session fields (`vad`, `sampling`,
`output_type`) and `conversation.select`.

Every field of OpenAI's session and response objects is honoured or refused unless its value
asks for nothing (inputs/realtime_params.py: tools, tracing, noise reduction...), and a wrong
value is a ProtocolError whose message names the field, sent back as an `error` event.
`temperature` (OpenAI's range, 0.6..1.2) is the sampling temperature of the answer's speech
stream, or of its text stream for a text answer. Every message goes through
`json_input.parse_json`, so nesting, huge numbers or bad Unicode end as a ProtocolError too.
A session.update is parsed in session_update.py, the events about conversation items
(create, truncate, retrieve, delete) in item_events.py, and the fields events share in
event_fields.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from kimiaudio.server.inputs.json_input import JsonInputError, parse_json
from kimiaudio.server.inputs.openai_params import checked
from kimiaudio.server.inputs.realtime_params import (
    RESPONSE_AUDIO_FIELDS,
    RESPONSE_AUDIO_OUTPUT_FIELDS,
    RESPONSE_FIELDS,
    RealtimeSampling,
)
from kimiaudio.server.session.event_fields import (
    ProtocolError,
    decode_pcm16,
    metadata_field,
    object_field,
    optional_object,
    output_limit,
    output_type_field,
    pcm16_rate,
    typed_field,
    voice_field,
)
from kimiaudio.server.session.item_events import (
    ITEM_EVENT_TYPES,
    InputItem,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    parse_input_items,
    parse_item_event,
)
from kimiaudio.server.session.session_update import SessionUpdate, parse_session_update
from kimiaudio.text.output_type import TEXT

MAX_CLIENT_MESSAGE_BYTES = 64 * 1024  # data-channel messages (no audio travels there)


@dataclass(frozen=True)
class ResponseCancel:
    response_id: str | None = None
    stop_playback: bool = False  # output_audio_buffer.clear: "stop what plays", quiet when nothing does


@dataclass(frozen=True)
class ResponseCreate:  # each field: this response only, None = the session's
    output_type: str | None = None
    instructions: str | None = None
    voice: str | None = None
    temperature: float | None = None
    max_new_tokens: int | None = None
    metadata: dict[str, str] | None = None  # echoed in the response object
    out_of_band: bool = False  # conversation "none": an answer kept out of the conversation
    input: tuple[InputItem, ...] | None = None  # an out-of-band answer's own context (None: the conversation)


@dataclass(frozen=True)
class ConversationSelect:
    conversation_id: str | None  # None = start a new conversation


@dataclass(frozen=True)
class AudioAppend:
    pcm16: bytes  # little-endian 16-bit mono at the session's input rate (may end inside a sample)


@dataclass(frozen=True)
class AudioCommit:
    pass


@dataclass(frozen=True)
class AudioClear:
    pass


ClientEvent = (
    SessionUpdate
    | ResponseCancel
    | ResponseCreate
    | ConversationSelect
    | AudioAppend
    | AudioCommit
    | AudioClear
    | ItemCreate
    | ItemTruncate
    | ItemRetrieve
    | ItemDelete
)
CLIENT_EVENT_TYPES = (
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    *ITEM_EVENT_TYPES,
    "response.create",
    "response.cancel",
    "output_audio_buffer.clear",
    "conversation.select",
    "transcription_session.update",
)


def parse_client_event(message: str | bytes, max_bytes: int = MAX_CLIENT_MESSAGE_BYTES) -> ClientEvent:
    """Validate one message; raises ProtocolError saying what was wrong."""
    return parse_client_message(message, max_bytes)[0]


def parse_client_message(
    message: str | bytes, max_bytes: int = MAX_CLIENT_MESSAGE_BYTES, webrtc: bool = False
) -> tuple[ClientEvent, str | None]:
    """(the event, the client's `event_id` for it); a ProtocolError names that id too, so the
    `error` answering it can (OpenAI's `error.event_id`). `webrtc`: it came on a call's data
    channel, where audio formats name the media's (event_fields.pcm16_rate)."""
    try:
        data = parse_json(message, max_bytes)
    except JsonInputError as exc:
        raise ProtocolError("invalid_event" if exc.code == "too_large" else exc.code, f"message: {exc}") from None
    data = object_field(data, "event")
    event_id = data.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        raise ProtocolError("invalid_value", f"event_id: expected a string, got {event_id!r}"[:200], "event_id")
    try:
        return _event(data, webrtc), event_id
    except ProtocolError as exc:
        exc.event_id = event_id
        raise


def _event(data: dict, webrtc: bool) -> ClientEvent:
    kind = data.get("type")
    if kind not in CLIENT_EVENT_TYPES:
        raise ProtocolError(
            "unknown_event",
            f"unknown event type {kind!r}"[:200] + f" (kimiaudio understands: {', '.join(CLIENT_EVENT_TYPES)})",
            "type",
        )
    if kind in ("response.cancel", "output_audio_buffer.clear"):
        return ResponseCancel(
            typed_field(data, "response_id", str, kind, "a string"), kind == "output_audio_buffer.clear"
        )
    if kind == "input_audio_buffer.append":
        return AudioAppend(decode_pcm16(data.get("audio"), f"{kind}.audio", whole_samples=False))
    if kind == "input_audio_buffer.commit":
        return AudioCommit()
    if kind == "input_audio_buffer.clear":
        return AudioClear()
    if kind in ITEM_EVENT_TYPES:
        return parse_item_event(data, kind)
    if kind == "response.create":
        return _response_create(optional_object(data, "response", "response"), "response", webrtc)
    if kind == "conversation.select":
        if "conversation_id" not in data:  # (null is a choice: a new conversation; no field is none)
            raise ProtocolError(
                "missing_required_parameter",
                f"{kind}: conversation_id is required (null starts a new conversation)",
                f"{kind}.conversation_id",
            )
        conversation_id = data["conversation_id"]
        if conversation_id is not None and (not isinstance(conversation_id, str) or not conversation_id):
            raise ProtocolError(
                "invalid_event",
                f"{kind}: conversation_id must be a non-empty string or null",
                f"{kind}.conversation_id",
            )
        return ConversationSelect(conversation_id)
    if "session" not in data:
        raise ProtocolError("missing_required_parameter", f"{kind}: session is required", "session")
    kind = "transcription" if kind == "transcription_session.update" else None  # (beta's)
    return parse_session_update(object_field(data["session"], "session"), "session", kind, webrtc)


def _response_create(response: dict, where: str, webrtc: bool) -> ResponseCreate:
    RESPONSE_FIELDS.check(response, f"{where}.", ProtocolError)
    audio = optional_object(response, "audio", f"{where}.audio")
    RESPONSE_AUDIO_FIELDS.check(audio, f"{where}.audio.", ProtocolError)
    audio_out = optional_object(audio, "output", f"{where}.audio.output")
    RESPONSE_AUDIO_OUTPUT_FIELDS.check(audio_out, f"{where}.audio.output.", ProtocolError)
    pcm16_rate(response.get("output_audio_format"), f"{where}.output_audio_format", True, webrtc)
    pcm16_rate(audio_out.get("format"), f"{where}.audio.output.format", True, webrtc)
    limit = output_limit(response, where)
    sampling = checked(RealtimeSampling, {"temperature": response.get("temperature")}, f"{where}.", ProtocolError)
    voice = voice_field(response, "voice", where) or voice_field(audio_out, "voice", f"{where}.audio.output")
    output_type = output_type_field(response, where)
    conversation = response.get("conversation", "auto")
    if conversation not in ("auto", "none"):
        raise ProtocolError(
            "invalid_value",
            f'{where}.conversation: expected "auto" or "none", got {conversation!r}'[:200],
            f"{where}.conversation",
        )
    out_of_band = conversation == "none"
    items = response.get("input")
    if items is not None and not out_of_band:
        raise ProtocolError(
            "invalid_value",
            f'{where}.input: only an out-of-band response (conversation "none") takes input',
            f"{where}.input",
        )
    if out_of_band and output_type not in (None, TEXT):
        key = "output_modalities" if "output_modalities" in response else "modalities"
        raise ProtocolError(
            "invalid_value", f'{where}.{key}: an out-of-band response answers in text (["text"])', f"{where}.{key}"
        )
    return ResponseCreate(
        TEXT if out_of_band else output_type,
        typed_field(response, "instructions", str, where, "text"),
        voice,
        sampling.get("temperature"),
        limit,
        metadata_field(response.get("metadata"), f"{where}.metadata"),
        out_of_band,
        parse_input_items(items, f"{where}.input") if items is not None else None,
    )
