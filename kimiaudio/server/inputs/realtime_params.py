"""The request fields of OpenAI's Realtime API and what kimiaudio does with each, declared as
openai_params.py declares the HTTP routes' (honoured, refused unless the value asks for nothing,
or ignored): the session object in its beta and GA shapes (session.update, transcription
sessions, client secrets), response.create's response, and the calls and client-secret routes'
bodies; with the ranges of the honoured numbers. README's compatibility table lists the same
fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimiaudio.audio.time_stretch import MAX_SPEED, MIN_SPEED
from kimiaudio.config import MAX_NEW_TOKENS
from kimiaudio.server.inputs.openai_params import NO_TOOLS, OUTPUT_LIMIT, Fields, empty
from kimiaudio.validation import Bounds, setting


def _tool_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, dict) and isinstance(t.get("type"), str) for t in value)


def _tracing(value: Any) -> bool:
    """ "auto", or a tracing object as OpenAI types it."""
    if value == "auto":
        return True
    types = {"workflow_name": str, "group_id": str, "metadata": dict}
    return isinstance(value, dict) and all(key in types and isinstance(v, types[key]) for key, v in value.items())


# A Realtime client declares its tools in the session.update that carries its whole set-up
# (instructions, voice, transcription), which a refused field would refuse whole; so tools are
# taken and never called, as a model that answers "auto" without calling any would. A choice
# that demands a call is refused (NO_TOOLS: chat completions refuse any tool).
DECLARED_TOOLS = {
    "tools": (_tool_list, "a list of tool objects (taken, never called: kimiaudio has no function calling)"),
    "tool_choice": (NO_TOOLS["tool_choice"][0], '"auto" or "none" (no tool is called either way)'),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "true or false (no tool is called)"),
}

SESSION_FIELDS = Fields(  # session.update's session (beta and GA shapes), transcription_session.update's
    honoured=frozenset(
        {
            "type",
            "modalities",
            "output_modalities",
            "instructions",
            "voice",
            "input_audio_format",
            "output_audio_format",
            "turn_detection",
            "temperature",
            "max_response_output_tokens",
            "max_output_tokens",
            "audio",
            "vad",
            "sampling",
            "output_type",
            "input_audio_transcription",
            "truncation",
            "include",
            "speed",
            "input_audio_noise_reduction",
        }
    ),
    neutral={
        **DECLARED_TOOLS,
        "tracing": (_tracing, 'null, "auto" or {workflow_name, group_id, metadata} (no traces are kept)'),
        "prompt": (lambda v: False, "nothing"),
        "reasoning": (lambda v: False, "nothing: not a reasoning model"),
    },
    # The model is the one connected to (?model=), as OpenAI keeps it; the rest echo session.created.
    ignored=frozenset({"model", "id", "object", "client_secret", "expires_at"}),
)

TRUNCATION_FIELDS = Fields(honoured=frozenset({"type", "retention_ratio", "token_limits"}))  # GA session.truncation
TOKEN_LIMITS_FIELDS = Fields(honoured=frozenset({"post_instructions"}))  # its token_limits

CALL_FIELDS = Fields(honoured=frozenset({"sdp", "session"}))  # POST /v1/realtime/calls' multipart parts
CLIENT_SECRET_FIELDS = Fields(honoured=frozenset({"expires_after", "session"}))  # POST /v1/realtime/client_secrets
EXPIRES_AFTER_FIELDS = Fields(honoured=frozenset({"anchor", "seconds"}))
BETA_TRANSCRIPTION_SESSION_FIELDS = Fields(  # POST /v1/realtime/transcription_sessions (beta): the session
    honoured=frozenset(
        {
            "client_secret",
            "include",
            "input_audio_format",
            "input_audio_noise_reduction",
            "input_audio_transcription",
            "modalities",
            "turn_detection",
        }
    )
)
BETA_CLIENT_SECRET_FIELDS = Fields(honoured=frozenset({"expires_at"}))  # its client_secret
BETA_SESSION_CLIENT_SECRET_FIELDS = Fields(honoured=frozenset({"expires_after"}))  # POST /v1/realtime/sessions'

SESSION_AUDIO_FIELDS = Fields(honoured=frozenset({"input", "output"}))  # GA session.audio
AUDIO_INPUT_FIELDS = Fields(honoured=frozenset({"format", "turn_detection", "transcription", "noise_reduction"}))
NOISE_REDUCTION_FIELDS = Fields(honoured=frozenset({"type"}))  # GA audio.input.noise_reduction, beta's too

AUDIO_OUTPUT_FIELDS = Fields(honoured=frozenset({"format", "voice", "speed"}))  # GA session.audio.output
RESPONSE_AUDIO_FIELDS = Fields(honoured=frozenset({"output"}))  # GA response.audio
RESPONSE_AUDIO_OUTPUT_FIELDS = Fields(  # GA response.audio.output: the speed is the session's
    honoured=frozenset({"format", "voice"}),
    neutral={"speed": (lambda v: v == 1.0, "1.0 (set the session's audio.output.speed)")},
)

TURN_DETECTION_FIELDS = Fields(  # beta session.turn_detection, GA session.audio.input.turn_detection
    honoured=frozenset(
        {
            "type",
            "threshold",
            "silence_duration_ms",
            "prefix_padding_ms",
            "create_response",
            "interrupt_response",
            "idle_timeout_ms",
            "eagerness",
        }
    ),
)

INPUT_TRANSCRIPTION_FIELDS = Fields(  # beta input_audio_transcription, GA audio.input.transcription
    honoured=frozenset({"model", "language", "prompt"}),
    neutral={
        "languages": (empty, "[] (name one `language`)"),
        "keywords": (empty, "[] (give them in `prompt`)"),
        "delay": (lambda v: False, "null"),
    },
)

RESPONSE_FIELDS = Fields(  # response.create's response
    honoured=frozenset(
        {
            "modalities",
            "output_modalities",
            "instructions",
            "voice",
            "temperature",
            "max_output_tokens",
            "max_response_output_tokens",
            "output_audio_format",
            "audio",
            "metadata",
            "conversation",
            "input",
        }
    ),
    neutral={
        **DECLARED_TOOLS,
        "prompt": (lambda v: False, "nothing"),
        "reasoning": (lambda v: False, "nothing: not a reasoning model"),
    },
)


@dataclass(frozen=True)
class RealtimeSampling:
    """session.update's and response.create's sampling fields (OpenAI's temperature range)."""

    temperature: float | None = setting(None, Bounds(0.6, 1.2))
    max_output_tokens: int | None = setting(None, OUTPUT_LIMIT)


@dataclass(frozen=True)
class RealtimeSpeed:
    """session.update's audio.output.speed (beta: speed), OpenAI's range."""

    speed: float | None = setting(None, Bounds(MIN_SPEED, MAX_SPEED))


@dataclass(frozen=True)
class RealtimeTruncation:
    """A GA session's truncation of type retention_ratio (OpenAI's ranges)."""

    retention_ratio: float | None = setting(None, Bounds(0.0, 1.0))
    post_instructions: int | None = setting(None, Bounds(1, MAX_NEW_TOKENS.max))


@dataclass(frozen=True)
class RealtimeTurnDetection:
    """turn_detection's own numbers (the rest are config [vad] keys, checked as the config's)."""

    # At least a second: a response for every few windows of silence would be no idle timeout.
    idle_timeout_ms: int | None = setting(None, Bounds(1000, 86_400_000))
