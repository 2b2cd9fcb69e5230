"""A `session.update`, parsed and checked once (both shapes of OpenAI's session object, beta
and GA, realtime or transcription, GA's `truncation` too, plus kimiaudio's `vad`, `sampling`
and `output_type`; beta's `transcription_session.update` too): every value is checked here,
against the same declared ranges as the configuration, so SessionSettings.apply has only to
apply it (session_settings.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from kimiaudio.audio.noise_reduction import NOISE_REDUCTION_KINDS
from kimiaudio.config import check_setting
from kimiaudio.errors import ConfigError, KimiAudioError
from kimiaudio.server.inputs.openai_params import MODEL_ID, checked
from kimiaudio.server.inputs.realtime_params import (
    AUDIO_INPUT_FIELDS,
    AUDIO_OUTPUT_FIELDS,
    INPUT_TRANSCRIPTION_FIELDS,
    NOISE_REDUCTION_FIELDS,
    SESSION_AUDIO_FIELDS,
    SESSION_FIELDS,
    TOKEN_LIMITS_FIELDS,
    TRUNCATION_FIELDS,
    RealtimeSampling,
    RealtimeSpeed,
    RealtimeTruncation,
)
from kimiaudio.server.session.event_fields import (
    ProtocolError,
    object_field,
    optional_object,
    output_limit,
    output_type_field,
    pcm16_rate,
    typed_field,
    voice_field,
)
from kimiaudio.server.session.turn_detection_field import TURN_DETECTION_VAD, Detection, parse_turn_detection
from kimiaudio.text.asr_instruction import check_language
from kimiaudio.text.output_type import OUTPUT_TYPES

SESSION_TYPES = ("realtime", "transcription")
TRANSCRIPTION_LOGPROBS = "item.input_audio_transcription.logprobs"  # what `include` may name


@dataclass(frozen=True)
class Transcription:
    """How a session transcribes the user's words (OpenAI's input audio transcription)."""

    model: str = MODEL_ID  # the name the client gave (the words are Kimi-Audio's own ASR)
    language: str | None = None  # a Whisper code: picks the official instruction (asr_instruction.py)
    prompt: str = ""  # prior text, as /v1/audio/transcriptions' prompt


@dataclass(frozen=True)
class SessionTruncation:
    """How a session's conversation is cut when it outgrows the context (OpenAI's GA
    `truncation`; what a turn does with it: pipeline/turn_prompt.py)."""

    kind: str = "auto"  # "auto" | "disabled" | "retention_ratio"
    retention_ratio: float = 1.0  # of the allowance, kept when cutting ("auto": 1.0)
    post_instructions: int | None = None  # the client's limit on what follows the instructions


@dataclass(frozen=True)
class TurnUpdate:
    """How the session's turns are detected: OpenAI's turn_detection, onto config [vad] keys."""

    vad: dict[str, Any] = field(default_factory=dict)  # keys of config [vad]
    detection: str | None = None  # "server_vad" | "semantic_vad" (the same VAD) | "none"
    create_response: bool | None = None  # server VAD: a commit starts a response
    idle_timeout_ms: int | None = None  # server VAD: silence after an answer that prompts a response
    eagerness: str | None = None  # semantic_vad's (turn_detection_field.py)
    # The [vad] keys a turn_detection object sets: OpenAI replaces the whole object, so those it
    # leaves out go back to the server's values (its [vad]) instead of keeping earlier ones.
    resets: tuple[str, ...] = ()


@dataclass(frozen=True)
class AnswerUpdate:
    """How the session's answers are made."""

    sampling: dict[str, Any] = field(default_factory=dict)  # keys of config [sampling]
    output_type: str | None = None  # "both" | "text"
    instructions: str | None = None
    voice: str | None = None  # a stored voice, or a stock name
    voice_field: str = "session.voice"  # where the client named it (its error's `param`)
    temperature: float | None = None  # OpenAI's: of the answer's main stream (see the docstring)
    speed: float | None = None  # the answer's audio played this much faster (OpenAI's audio.output.speed)
    tool_choice: str | None = None  # "auto" | "none": either way no tool is called (realtime_params.DECLARED_TOOLS)


@dataclass(frozen=True)
class SessionUpdate:
    """A session.update's changes; every None (or empty part) leaves that setting as it is."""

    turns: TurnUpdate = field(default_factory=TurnUpdate)
    answers: AnswerUpdate = field(default_factory=AnswerUpdate)
    input_rate: int | None = None  # pcm16 sample rate of input_audio_buffer.append
    # input_audio_transcription: None = unchanged, False = off
    transcription: Transcription | Literal[False] | None = None
    noise_reduction: str | Literal[False] | None = None  # "near_field" | "far_field" (False: off)
    kind: str | None = None  # the session's type: "realtime" | "transcription" (None: unchanged)
    truncation: SessionTruncation | None = None
    transcription_logprobs: bool | None = None  # include: "item.input_audio_transcription.logprobs"


def parse_session_update(session: dict, where: str, kind: str | None = None, webrtc: bool = False) -> SessionUpdate:
    """`kind`: the session type the event implies (beta's transcription_session.update);
    `webrtc`: the session is a WebRTC call's (its audio formats: event_fields.pcm16_rate)."""
    SESSION_FIELDS.check(session, f"{where}.", ProtocolError)
    kind = _session_type(session, where) or kind
    output_type = session.get("output_type")
    if output_type is not None and output_type not in OUTPUT_TYPES:
        raise ProtocolError(
            "invalid_event",
            f"{where}.output_type: expected 'both' or 'text', got {output_type!r}"[:200],
            f"{where}.output_type",
        )
    output_type = output_type_field(session, where) or output_type
    audio = optional_object(session, "audio", f"{where}.audio")  # GA shape
    SESSION_AUDIO_FIELDS.check(audio, f"{where}.audio.", ProtocolError)
    audio_in = optional_object(audio, "input", f"{where}.audio.input")
    audio_out = optional_object(audio, "output", f"{where}.audio.output")
    AUDIO_INPUT_FIELDS.check(audio_in, f"{where}.audio.input.", ProtocolError)
    AUDIO_OUTPUT_FIELDS.check(audio_out, f"{where}.audio.output.", ProtocolError)
    # The client's own [vad] keys are checked before a turn_detection object (checked itself) sets
    # some of them.
    vad = _checked(dict(object_field(session.get("vad", {}), f"{where}.vad")), "vad", where)
    sampling = _checked(dict(object_field(session.get("sampling", {}), f"{where}.sampling")), "sampling", where)
    detection: Detection | None = None
    resets: tuple[str, ...] = ()
    for key, container, path in (
        ("turn_detection", session, where),
        ("turn_detection", audio_in, f"{where}.audio.input"),
    ):
        if key in container:
            detection = parse_turn_detection(container[key], vad, f"{path}.{key}")
            resets = tuple(ours for ours, _, _ in TURN_DETECTION_VAD) if detection.kind != "none" else ()
    limit = output_limit(session, where)
    if limit is not None:
        sampling.setdefault("max_new_tokens", limit)
    temperature = checked(RealtimeSampling, {"temperature": session.get("temperature")}, f"{where}.", ProtocolError)
    speed = checked(RealtimeSpeed, {"speed": session.get("speed")}, f"{where}.", ProtocolError).get("speed")
    ga_speed = checked(RealtimeSpeed, {"speed": audio_out.get("speed")}, f"{where}.audio.output.", ProtocolError)
    speed = ga_speed.get("speed", speed)
    voice, voice_param = voice_field(session, "voice", where), f"{where}.voice"
    ga_voice = voice_field(audio_out, "voice", f"{where}.audio.output")
    if voice is None and ga_voice is not None:
        voice, voice_param = ga_voice, f"{where}.audio.output.voice"
    input_rate = pcm16_rate(session.get("input_audio_format"), f"{where}.input_audio_format", webrtc=webrtc)
    input_rate = pcm16_rate(audio_in.get("format"), f"{where}.audio.input.format", webrtc=webrtc) or input_rate
    pcm16_rate(session.get("output_audio_format"), f"{where}.output_audio_format", True, webrtc)
    pcm16_rate(audio_out.get("format"), f"{where}.audio.output.format", True, webrtc)
    return SessionUpdate(
        turns=_turn_update(vad, detection, resets),
        answers=AnswerUpdate(
            sampling,
            output_type,
            typed_field(session, "instructions", str, where, "text"),
            voice,
            voice_param,
            temperature.get("temperature"),
            speed,
            session.get("tool_choice"),  # (checked with the fields: "auto" or "none")
        ),
        input_rate=input_rate,
        transcription=_transcription(session, audio_in, where),
        noise_reduction=_noise_reduction(session, audio_in, where),
        kind=kind,
        truncation=_truncation(session.get("truncation"), f"{where}.truncation"),
        transcription_logprobs=_include(session.get("include"), f"{where}.include"),
    )


def _session_type(session: dict, where: str) -> str | None:
    kind = session.get("type")
    if kind is not None and kind not in SESSION_TYPES:
        raise ProtocolError(
            "invalid_value", f"{where}.type: expected realtime or transcription, got {kind!r}"[:200], f"{where}.type"
        )
    return kind


def _input_object(
    session: dict, audio_in: dict, where: str, beta: str, ga: str
) -> tuple[dict, str] | Literal[False] | None:
    """Beta's `session[beta]` or GA's `audio.input[ga]`, whichever was given: (the object, its
    path); False for a null (off); None when neither was given (unchanged)."""
    for container, key, path in ((session, beta, f"{where}.{beta}"), (audio_in, ga, f"{where}.audio.input.{ga}")):
        if key in container:
            return False if container[key] is None else (object_field(container[key], path), path)
    return None


def _transcription(session: dict, audio_in: dict, where: str) -> Transcription | Literal[False] | None:
    """Beta `input_audio_transcription` or GA `audio.input.transcription`: null turns it off,
    an object on (any model name: the words are Kimi-Audio's own ASR); its `language` picks the
    official instruction and its `prompt` is prior text, as /v1/audio/transcriptions takes them."""
    given = _input_object(session, audio_in, where, "input_audio_transcription", "transcription")
    if not isinstance(given, tuple):
        return given  # (False or None)
    value, path = given
    INPUT_TRANSCRIPTION_FIELDS.check(value, f"{path}.", ProtocolError)
    language = typed_field(value, "language", str, path, "a language code") or None
    if language is not None:
        try:
            language = check_language(language)
        except KimiAudioError as exc:
            raise ProtocolError("invalid_value", f"{path}.{exc}", f"{path}.language") from None
    return Transcription(
        typed_field(value, "model", str, path, "a model name") or MODEL_ID,
        language,
        typed_field(value, "prompt", str, path, "text") or "",
    )


def _noise_reduction(session: dict, audio_in: dict, where: str) -> str | Literal[False] | None:
    """Beta `input_audio_noise_reduction` or GA `audio.input.noise_reduction`: null turns it
    off, `{"type": "near_field" | "far_field"}` on (audio/noise_reduction.py)."""
    given = _input_object(session, audio_in, where, "input_audio_noise_reduction", "noise_reduction")
    if not isinstance(given, tuple):
        return given
    value, path = given
    NOISE_REDUCTION_FIELDS.check(value, f"{path}.", ProtocolError)
    kind = value.get("type")
    if kind not in NOISE_REDUCTION_KINDS:
        expected = " or ".join(repr(k) for k in NOISE_REDUCTION_KINDS)
        raise ProtocolError("invalid_value", f"{path}.type: expected {expected}, got {kind!r}"[:200], f"{path}.type")
    return kind


def _include(value: Any, where: str) -> bool | None:
    """OpenAI's `include` -> whether the user's words come with their logprobs (None: left out)."""
    if value is None:
        return None
    if not isinstance(value, list) or any(item != TRANSCRIPTION_LOGPROBS for item in value):
        raise ProtocolError(
            "invalid_value", f"{where}: expected [] or [{TRANSCRIPTION_LOGPROBS!r}], got {value!r}"[:200], where
        )
    return bool(value)


def _truncation(value: Any, where: str) -> SessionTruncation | None:
    """ "auto", "disabled", or {"type": "retention_ratio", "retention_ratio": r, "token_limits":
    {"post_instructions": n}} (r and n in OpenAI's ranges); None where it was left out."""
    if value is None:
        return None
    if value in ("auto", "disabled"):
        return SessionTruncation(value)
    if not isinstance(value, dict):
        raise ProtocolError(
            "invalid_value", f'{where}: expected "auto", "disabled" or an object, got {value!r}'[:200], where
        )
    TRUNCATION_FIELDS.check(value, f"{where}.", ProtocolError)
    for key in ("type", "retention_ratio"):
        if value.get(key) is None:
            raise ProtocolError("missing_required_parameter", f"{where}.{key} is required", f"{where}.{key}")
    if value.get("type") != "retention_ratio":
        raise ProtocolError(
            "invalid_value", f"{where}.type: expected retention_ratio, got {value.get('type')!r}"[:200], f"{where}.type"
        )
    limits = optional_object(value, "token_limits", f"{where}.token_limits")
    TOKEN_LIMITS_FIELDS.check(limits, f"{where}.token_limits.", ProtocolError)
    ratio = checked(RealtimeTruncation, {"retention_ratio": value["retention_ratio"]}, f"{where}.", ProtocolError)
    limit = checked(RealtimeTruncation, limits, f"{where}.token_limits.", ProtocolError)
    return SessionTruncation("retention_ratio", ratio["retention_ratio"], limit.get("post_instructions"))


def _checked(values: dict, section: str, where: str) -> dict[str, Any]:
    """Keys of config [section], each checked against its declared type and range here, so a
    bad value is answered at once instead of failing a turn later."""
    try:
        return {key: check_setting(section, key, item) for key, item in values.items()}
    except ConfigError as exc:
        raise ProtocolError("invalid_value", f"{where}.{exc}", f"{where}.{section}") from None


def _turn_update(vad: dict[str, Any], detection: Detection | None, resets: tuple[str, ...]) -> TurnUpdate:
    if detection is None:
        return TurnUpdate(vad, resets=resets)
    return TurnUpdate(
        vad, detection.kind, detection.create_response, detection.idle_timeout_ms, detection.eagerness, resets
    )
