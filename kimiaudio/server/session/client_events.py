"""Client -> server events of the real-time protocol, parsed and validated (both transports).

The WebRTC data channel and the WebSocket (GET /v1/realtime) speak the same events. They are
the OpenAI Realtime API's core, in its beta shape (what `client.beta.realtime.connect()`
sends: `session.modalities`, `input_audio_format`, `turn_detection`, ...) and its GA shape
(`client.realtime.connect()`: `session.output_modalities`, `session.audio.input.format`,
`session.audio.input.turn_detection`, `session.audio.output.voice`, ...), plus kimiaudio's
own session fields (`vad`, `sampling`, `output_type`) and `conversation.select`.

Every field of OpenAI's session and response objects is honoured or refused unless its value
asks for nothing (inputs/openai_params.py: tools, tracing, noise reduction...), and a wrong
value is a ProtocolError whose message names the field, sent back as an `error` event.
`temperature` (OpenAI's range, 0.6..1.2) is the sampling temperature of the answer's speech
stream, or of its text stream for a text answer. Every message goes through
`json_input.parse_json`, so nesting, huge numbers or bad Unicode end as a ProtocolError too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kimiaudio.audio import pcm16
from kimiaudio.audio.rates import OPENAI_PCM16_RATE, SPEECH_INPUT_RATE
from kimiaudio.config import check_setting
from kimiaudio.errors import AudioInputError, ConfigError, KimiAudioError
from kimiaudio.server.inputs.json_input import JsonInputError, parse_json
from kimiaudio.server.inputs.openai_params import (AUDIO_INPUT_FIELDS, AUDIO_OUTPUT_FIELDS, RESPONSE_FIELDS,
                                                   SESSION_FIELDS, RealtimeSampling, checked)
from kimiaudio.text.output_type import EXPECTED_MODALITIES, OUTPUT_TYPES, output_type_of

MAX_CLIENT_MESSAGE_BYTES = 64 * 1024  # data-channel messages (no audio travels there)
INPUT_RATES = (SPEECH_INPUT_RATE, OPENAI_PCM16_RATE)  # pcm16 input rates a session takes


class ProtocolError(KimiAudioError):
    """A client event that cannot be used; `code` is machine-readable, `param` names the field."""

    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


@dataclass(frozen=True)
class SessionUpdate:
    vad: dict[str, Any] = field(default_factory=dict)  # keys of config [vad]
    sampling: dict[str, Any] = field(default_factory=dict)  # keys of config [sampling]
    output_type: str | None = None  # "both" | "text"
    turn_detection: str | None = None  # "server_vad" | "none"
    create_response: bool | None = None  # server VAD: a commit starts a response
    instructions: str | None = None
    voice: str | None = None  # a stored voice, or a stock name
    input_rate: int | None = None  # pcm16 sample rate of input_audio_buffer.append
    temperature: float | None = None  # OpenAI's: of the answer's main stream (see the docstring)
    # input_audio_transcription: None = unchanged, False = off, {"model": name} = on
    transcription: dict[str, str] | bool | None = None


@dataclass(frozen=True)
class ResponseCancel:
    response_id: str | None = None


@dataclass(frozen=True)
class ResponseCreate:  # each field: this response only, None = the session's
    output_type: str | None = None
    instructions: str | None = None
    voice: str | None = None
    temperature: float | None = None
    max_new_tokens: int | None = None


@dataclass(frozen=True)
class ConversationSelect:
    conversation_id: str | None  # None = start a new conversation


@dataclass(frozen=True)
class AudioAppend:
    pcm16: bytes  # little-endian 16-bit mono at the session's input rate


@dataclass(frozen=True)
class AudioCommit:
    pass


@dataclass(frozen=True)
class AudioClear:
    pass


@dataclass(frozen=True)
class ItemCreate:
    role: str  # "user" | "assistant" | "system"
    text: str = ""
    pcm16: bytes | None = None  # user audio at the session's input rate
    item_id: str | None = None


@dataclass(frozen=True)
class ItemTruncate:
    item_id: str
    audio_end_ms: int


ClientEvent = (SessionUpdate | ResponseCancel | ResponseCreate | ConversationSelect | AudioAppend | AudioCommit
               | AudioClear | ItemCreate | ItemTruncate)
CLIENT_EVENT_TYPES = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
                      "input_audio_buffer.clear", "conversation.item.create", "conversation.item.truncate",
                      "response.create", "response.cancel", "output_audio_buffer.clear", "conversation.select")


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError("invalid_event", f"{where}: expected a JSON object, got {type(value).__name__}", where)
    return value


def typed_field(obj: dict, key: str, kinds: type | tuple, where: str, what: str) -> Any:
    """obj[key] if it is None or of `kinds` (a bool is no number here), else a ProtocolError."""
    value = obj.get(key)
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if value is not None and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
        raise ProtocolError("invalid_value", f"{where}.{key}: expected {what}, got {value!r}"[:300], f"{where}.{key}")
    return value


def decode_pcm16(data: Any, where: str) -> bytes:
    """Base64 audio of a client event: raw 16-bit samples (an even number of bytes)."""
    if not isinstance(data, str):
        raise ProtocolError("invalid_value", f"{where}: expected base64 text", where)
    try:
        return pcm16.check_samples(pcm16.from_base64(data, where), where)
    except AudioInputError as exc:
        raise ProtocolError("invalid_audio", str(exc), where) from None


def parse_client_event(message: str | bytes, max_bytes: int = MAX_CLIENT_MESSAGE_BYTES) -> ClientEvent:
    """Validate one message; raises ProtocolError saying what was wrong."""
    try:
        data = parse_json(message, max_bytes)
    except JsonInputError as exc:
        raise ProtocolError("invalid_event" if exc.code == "too_large" else exc.code, f"message: {exc}") from None
    data = _object(data, "event")
    kind = data.get("type")
    if kind not in CLIENT_EVENT_TYPES:
        raise ProtocolError("unknown_event", f"unknown event type {kind!r}"[:200]
                            + f" (kimiaudio understands: {', '.join(CLIENT_EVENT_TYPES)})", "type")
    if kind in ("response.cancel", "output_audio_buffer.clear"):
        return ResponseCancel(typed_field(data, "response_id", str, kind, "a string"))
    if kind == "input_audio_buffer.append":
        return AudioAppend(decode_pcm16(data.get("audio"), f"{kind}.audio"))
    if kind == "input_audio_buffer.commit":
        return AudioCommit()
    if kind == "input_audio_buffer.clear":
        return AudioClear()
    if kind == "conversation.item.create":
        return _item_create(_object(data.get("item"), "item"), "item")
    if kind == "conversation.item.truncate":
        item_id = typed_field(data, "item_id", str, kind, "an item id")
        end_ms = typed_field(data, "audio_end_ms", int, kind, "milliseconds (an integer >= 0)")
        if not item_id or end_ms is None or end_ms < 0:
            raise ProtocolError("invalid_value", f"{kind}: needs item_id and audio_end_ms >= 0", f"{kind}.audio_end_ms")
        return ItemTruncate(item_id, end_ms)
    if kind == "response.create":
        return _response_create(_object(data.get("response") or {}, "response"), "response")
    if kind == "conversation.select":
        conversation_id = data.get("conversation_id")
        if conversation_id is not None and (not isinstance(conversation_id, str) or not conversation_id):
            raise ProtocolError("invalid_event", f"{kind}: conversation_id must be a non-empty string or null",
                                f"{kind}.conversation_id")
        return ConversationSelect(conversation_id)
    return _session_update(_object(data.get("session", {}), "session"), "session")


def _item_create(item: dict, where: str) -> ItemCreate:
    if item.get("type", "message") != "message":
        raise ProtocolError("unsupported", f"{where}.type: only message items are supported, got {item.get('type')!r}"[:200],
                            f"{where}.type")
    role = item.get("role")
    if role not in ("user", "assistant", "system"):
        raise ProtocolError("invalid_value", f"{where}.role: expected user, assistant or system, got {role!r}"[:200],
                            f"{where}.role")
    content = item.get("content") or []
    if not isinstance(content, list):
        raise ProtocolError("invalid_value", f"{where}.content: expected a list of content parts", f"{where}.content")
    texts, audio = [], None
    for i, part in enumerate(content):
        part = _object(part, f"{where}.content[{i}]")
        if part.get("type") in ("input_text", "text", "output_text"):
            texts.append(typed_field(part, "text", str, f"{where}.content[{i}]", "text") or "")
        elif part.get("type") == "input_audio" and role == "user":
            if audio is not None:
                raise ProtocolError("invalid_value", f"{where}.content: at most one input_audio part", f"{where}.content")
            audio = decode_pcm16(part.get("audio"), f"{where}.content[{i}].audio")
        else:
            raise ProtocolError("unsupported", f"{where}.content[{i}].type: {part.get('type')!r} is not supported here"[:200],
                                f"{where}.content[{i}].type")
    if not texts and audio is None:
        raise ProtocolError("invalid_value", f"{where}.content: no text or audio", f"{where}.content")
    return ItemCreate(role, "\n".join(texts), audio, typed_field(item, "id", str, where, "a string"))


def _response_create(response: dict, where: str) -> ResponseCreate:
    RESPONSE_FIELDS.check(response, f"{where}.", ProtocolError)
    audio_out = _object(_object(response.get("audio") or {}, f"{where}.audio").get("output") or {}, f"{where}.audio.output")
    AUDIO_OUTPUT_FIELDS.check(audio_out, f"{where}.audio.output.", ProtocolError)
    _input_rate(response.get("output_audio_format"), f"{where}.output_audio_format", output=True)
    _input_rate(audio_out.get("format"), f"{where}.audio.output.format", output=True)
    limit = _output_limit(response, where)
    sampling = checked(RealtimeSampling, {"temperature": response.get("temperature")}, f"{where}.", ProtocolError)
    voice = (typed_field(response, "voice", str, where, "a voice name")
             or typed_field(audio_out, "voice", str, f"{where}.audio.output", "a voice name"))
    return ResponseCreate(_output_type(response, where), typed_field(response, "instructions", str, where, "text"),
                          voice, sampling.get("temperature"), limit)


def _output_limit(obj: dict, where: str) -> int | None:
    """max_output_tokens (GA) or max_response_output_tokens (beta): a positive integer or "inf"."""
    key = "max_output_tokens" if "max_output_tokens" in obj else "max_response_output_tokens"
    limit = obj.get(key)
    if limit is None or limit == "inf":
        return None

    def error(code: str, message: str, param: str) -> ProtocolError:
        return ProtocolError(code, message.replace("max_output_tokens", key), f"{where}.{key}")

    return checked(RealtimeSampling, {"max_output_tokens": limit}, f"{where}.", error)["max_output_tokens"]


def _output_type(obj: dict, where: str) -> str | None:
    key = "output_modalities" if "output_modalities" in obj else "modalities"
    modalities = obj.get(key)
    if modalities is None:
        return None
    output_type = output_type_of(modalities)
    if output_type is None:
        raise ProtocolError("invalid_value", f"{where}.{key}: expected {EXPECTED_MODALITIES}, got {modalities!r}"[:200],
                            f"{where}.{key}")
    return output_type


def _session_update(session: dict, where: str) -> SessionUpdate:
    SESSION_FIELDS.check(session, f"{where}.", ProtocolError)
    output_type = session.get("output_type")
    if output_type is not None and output_type not in OUTPUT_TYPES:
        raise ProtocolError("invalid_event", f"{where}.output_type: expected 'both' or 'text', got {output_type!r}"[:200],
                            f"{where}.output_type")
    output_type = _output_type(session, where) or output_type
    audio = _object(session.get("audio") or {}, f"{where}.audio")  # GA shape
    audio_in = _object(audio.get("input") or {}, f"{where}.audio.input")
    audio_out = _object(audio.get("output") or {}, f"{where}.audio.output")
    AUDIO_INPUT_FIELDS.check(audio_in, f"{where}.audio.input.", ProtocolError)
    AUDIO_OUTPUT_FIELDS.check(audio_out, f"{where}.audio.output.", ProtocolError)
    vad = dict(_object(session.get("vad", {}), f"{where}.vad"))
    sampling = dict(_object(session.get("sampling", {}), f"{where}.sampling"))
    turn_detection, create_response = None, None
    for key, container, path in (("turn_detection", session, where), ("turn_detection", audio_in, f"{where}.audio.input")):
        if key in container:
            turn_detection, create_response = _turn_detection(container[key], vad, f"{path}.{key}")
    limit = _output_limit(session, where)
    if limit is not None:
        sampling.setdefault("max_new_tokens", limit)
    temperature = checked(RealtimeSampling, {"temperature": session.get("temperature")}, f"{where}.", ProtocolError)
    voice = typed_field(session, "voice", str, where, "a voice name") or typed_field(audio_out, "voice", str, f"{where}.audio.output",
                                                                            "a voice name")
    input_rate = _input_rate(session.get("input_audio_format"), f"{where}.input_audio_format")
    input_rate = _input_rate(audio_in.get("format"), f"{where}.audio.input.format") or input_rate
    _input_rate(session.get("output_audio_format"), f"{where}.output_audio_format", output=True)
    _input_rate(audio_out.get("format"), f"{where}.audio.output.format", output=True)
    vad, sampling = _checked(vad, "vad", where), _checked(sampling, "sampling", where)
    return SessionUpdate(vad=vad, sampling=sampling, output_type=output_type, turn_detection=turn_detection,
                         create_response=create_response,
                         instructions=typed_field(session, "instructions", str, where, "text"), voice=voice,
                         input_rate=input_rate, temperature=temperature.get("temperature"),
                         transcription=_transcription(session, audio_in, where))


def _transcription(session: dict, audio_in: dict, where: str) -> dict[str, str] | bool | None:
    """Beta `input_audio_transcription` or GA `audio.input.transcription`: null turns it off,
    {"model": ...} on (any model name: the words are Kimi-Audio's own ASR). Its `language`
    and `prompt` are refused: the official ASR prompt is fixed and detects the language."""
    for container, path in ((session, f"{where}.input_audio_transcription"),
                            (audio_in, f"{where}.audio.input.transcription")):
        key = path.rsplit(".", 1)[1]
        if key not in container:
            continue
        if container[key] is None:
            return False
        value = _object(container[key], path)
        model = typed_field(value, "model", str, path, "a model name") or "kimi-audio-7b-instruct"
        for unused in ("language", "prompt"):
            if value.get(unused) not in (None, ""):
                raise ProtocolError("unsupported", f"{path}.{unused}: not supported (the user's words are "
                                    "transcribed with Kimi-Audio's fixed ASR prompt, which detects the language)",
                                    f"{path}.{unused}")
        return {"model": model}
    return None


def _checked(values: dict, section: str, where: str) -> dict[str, Any]:
    """Keys of config [section], each checked against its declared type and range here, so a
    bad value is answered at once instead of failing a turn later."""
    try:
        return {key: check_setting(section, key, item) for key, item in values.items()}
    except ConfigError as exc:
        raise ProtocolError("invalid_value", f"{where}.{exc}", f"{where}.{section}") from None


def _turn_detection(value: Any, vad: dict, where: str) -> tuple[str, bool | None]:
    """OpenAI's turn_detection onto config [vad] keys (filled into `vad`); (mode, create_response)."""
    if value is None:
        return "none", None
    value = _object(value, where)
    kind = value.get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad", "none"):  # semantic_vad: served by the same silero VAD
        raise ProtocolError("invalid_value", f"{where}.type: expected server_vad or null, got {kind!r}"[:200], f"{where}.type")
    for ours, theirs, kinds in (("threshold", "threshold", (int, float)), ("silence_ms", "silence_duration_ms", int),
                                ("prefix_padding_ms", "prefix_padding_ms", int), ("barge_in", "interrupt_response", bool)):
        if typed_field(value, theirs, kinds, where, "a " + ("boolean" if kinds is bool else "number")) is not None:
            vad[ours] = value[theirs]
    create = typed_field(value, "create_response", bool, where, "true or false")
    return ("none" if kind == "none" else "server_vad"), create


def _input_rate(fmt: Any, where: str, output: bool = False) -> int | None:
    """pcm16 (beta: 24 kHz) or GA {"type": "audio/pcm", "rate": 24000 | 16000 (input only)}."""
    if fmt is None or fmt == "pcm16":
        return None if fmt is None else OPENAI_PCM16_RATE
    if isinstance(fmt, dict) and fmt.get("type") == "audio/pcm":
        rate = fmt.get("rate", OPENAI_PCM16_RATE)
        if rate in (INPUT_RATES if not output else (OPENAI_PCM16_RATE,)):
            return rate
    raise ProtocolError("unsupported_format", f"{where}: kimiaudio takes and sends pcm16 (24 kHz{'' if output else ' or 16 kHz'}"
                        f" mono), got {fmt!r}"[:300], where)
