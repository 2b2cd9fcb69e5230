"""The `session` object of session.created / session.updated, in each shape of OpenAI's
Realtime API, from a session's settings (session_settings.py).

GA (`client.realtime.connect()`): `{type: "realtime", object, id, model, output_modalities,
instructions, audio: {input: {format, transcription, noise_reduction, turn_detection}, output:
{format, voice, speed}}, max_output_tokens, tools, tool_choice, tracing, truncation, prompt}`,
or a transcription session `{type: "transcription", object, id, audio: {input: ...}, include}`.
Beta (`client.beta.realtime.connect()`): the flat session (`modalities`, `voice`,
`input_audio_format`, `turn_detection`, `input_audio_transcription`, ...), or beta's
transcription session. Every field is sent, null where it is off, so a client reading one
finds it; values are the ones in effect, within what the SDK's models allow.

kimiaudio's own fields stand beside OpenAI's in both shapes (OpenAI's clients keep unknown
fields): `conversation_id`, `vad` and `sampling` (config sections), `output_type`,
`can_speak`, `temperature` (GA has none; it is honoured) and `input_audio_rate` (16000 when
the client sends 16 kHz pcm16, which OpenAI's format object cannot say: its `rate` is 24000
only, so it is left out then).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kimiaudio.audio.rates import OPENAI_PCM16_RATE, SPEECH_OUTPUT_RATE
from kimiaudio.server.inputs.openai_params import MODEL_ID
from kimiaudio.server.session.session_settings import SessionSettings
from kimiaudio.server.session.session_update import TRANSCRIPTION_LOGPROBS, SessionTruncation, Transcription
from kimiaudio.text.output_type import BOTH, modalities_of

# The transcription models beta's transcription session object allows (a Literal in the SDK).
BETA_TRANSCRIPTION_MODELS = ("gpt-4o-transcribe", "gpt-4o-mini-transcribe", "whisper-1")


def ga_session(settings: SessionSettings, session_id: str, conversation_id: str | None) -> dict[str, Any]:
    audio_in = {
        "format": _pcm(settings.input_rate),
        "transcription": _transcription(settings.transcription),
        "noise_reduction": _noise_reduction(settings),
        "turn_detection": _turn_detection(settings),
    }
    if settings.kind == "transcription":
        return {
            "type": "transcription",
            "object": "realtime.transcription_session",
            "id": session_id,
            "audio": {"input": audio_in},
            "include": _include(settings),
            **_extras(settings, conversation_id),
        }
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": MODEL_ID,
        "output_modalities": ["audio"] if settings.output_type == BOTH else ["text"],
        "instructions": settings.instructions,
        "audio": {
            "input": audio_in,
            "output": {"format": _pcm(SPEECH_OUTPUT_RATE), "voice": settings.voice, "speed": settings.speed},
        },
        "max_output_tokens": settings.config.sampling.max_new_tokens or "inf",
        "tools": [],
        "tool_choice": settings.tool_choice,
        "tracing": None,
        "truncation": _truncation(settings.truncation),
        "include": _include(settings),
        "prompt": None,
        **_extras(settings, conversation_id),
    }


def beta_session(settings: SessionSettings, session_id: str, conversation_id: str | None) -> dict[str, Any]:
    transcription = _transcription(settings.transcription)
    if settings.kind == "transcription":
        if transcription is not None and transcription["model"] not in BETA_TRANSCRIPTION_MODELS:
            del transcription["model"]  # one of beta's names, or none (the words are Kimi-Audio's own ASR)
        # No client_secret: OpenAI sends one only in the REST answer that made the session.
        return {
            "id": session_id,
            "object": "realtime.transcription_session",
            "modalities": ["text"],
            "input_audio_format": "pcm16",
            "input_audio_transcription": transcription,
            "input_audio_noise_reduction": _noise_reduction(settings),
            "turn_detection": _turn_detection(settings),
            "include": _include(settings),
            **_extras(settings, conversation_id),
        }
    # No `model`: beta's session object allows only OpenAI's model names there.
    return {
        "id": session_id,
        "object": "realtime.session",
        "modalities": modalities_of(settings.output_type),
        "instructions": settings.instructions,
        "voice": settings.voice,
        "input_audio_format": "pcm16",
        "output_audio_format": "pcm16",
        "input_audio_transcription": transcription,
        "input_audio_noise_reduction": _noise_reduction(settings),
        "turn_detection": _turn_detection(settings),
        "max_response_output_tokens": settings.config.sampling.max_new_tokens or "inf",
        "tools": [],
        "tool_choice": settings.tool_choice,
        "speed": settings.speed,
        "tracing": None,
        **_extras(settings, conversation_id),
    }


def _include(settings: SessionSettings) -> list[str]:
    return [TRANSCRIPTION_LOGPROBS] if settings.transcription_logprobs else []


def _truncation(truncation: SessionTruncation) -> str | dict[str, Any]:
    if truncation.kind != "retention_ratio":
        return truncation.kind
    limits = {"post_instructions": truncation.post_instructions} if truncation.post_instructions else None
    return {"type": "retention_ratio", "retention_ratio": truncation.retention_ratio, "token_limits": limits}


def _pcm(rate: int) -> dict[str, Any]:
    return {"type": "audio/pcm", "rate": rate} if rate == OPENAI_PCM16_RATE else {"type": "audio/pcm"}


def _transcription(transcription: Transcription | None) -> dict[str, Any] | None:
    if transcription is None:
        return None
    return {"model": transcription.model, "language": transcription.language, "prompt": transcription.prompt}


def _turn_detection(settings: SessionSettings) -> dict[str, Any] | None:
    """The server VAD's settings (None: the client commits), or semantic_vad's, as the client
    named it. A transcription session answers nothing, so it reports neither create_response
    nor interrupt_response."""
    if settings.turn_detection == "none":
        return None
    vad = settings.config.vad
    detection: dict[str, Any] = {
        "type": "server_vad",
        "threshold": vad.threshold,
        "prefix_padding_ms": vad.prefix_padding_ms,
        "silence_duration_ms": vad.silence_ms,
        "idle_timeout_ms": settings.idle_timeout_ms,
    }
    if settings.turn_detection == "semantic_vad":  # as asked for (the same VAD serves it)
        detection = {"type": "semantic_vad", "eagerness": settings.eagerness}
    if settings.kind == "realtime":
        detection |= {"create_response": settings.create_response, "interrupt_response": vad.barge_in}
    return detection


def _extras(settings: SessionSettings, conversation_id: str | None) -> dict[str, Any]:
    """kimiaudio's fields (the module docstring)."""
    sampling = settings.config.sampling
    temperature = settings.temperature
    if temperature is None:
        temperature = sampling.audio_temperature if settings.output_type == BOTH else sampling.text_temperature
    return {
        "conversation_id": conversation_id,
        "input_audio_rate": settings.input_rate,
        "temperature": temperature,
        "vad": dataclasses.asdict(settings.config.vad),
        "sampling": dataclasses.asdict(sampling),
        "output_type": settings.output_type,
        "can_speak": settings.can_speak,
    }


def _noise_reduction(settings: SessionSettings) -> dict[str, str] | None:
    return {"type": settings.noise_reduction} if settings.noise_reduction else None
