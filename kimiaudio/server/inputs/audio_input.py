"""Audio a /v1 request brings (an upload, a base64 input_audio part), decoded and checked.

Any container PyAV reads is taken (wav, mp3, flac, ogg/opus, webm, m4a/aac...; the format
is probed from the bytes, a declared format is only checked to be one of those), plus raw
`pcm16` (little-endian 16-bit mono at 24 kHz, what OpenAI's pcm16 means). The result is
16 kHz float32 mono that passed the same checks as every other input (not empty, not
silent, not longer than audio.max_input_seconds); every failure is a 400 naming the field.
A request with several parts decodes each against what its allowances have left
(audio_allowance.py), and takes what the part held off them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from kimiaudio.audio import pcm16
from kimiaudio.audio.io import DurationLimit, check_duration, check_speech_input, decode_audio_bytes
from kimiaudio.audio.rates import OPENAI_PCM16_RATE, SPEECH_INPUT_RATE
from kimiaudio.audio.resampling import resample
from kimiaudio.errors import AudioInputError, AudioTooLongError
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.inputs.audio_allowance import AudioAllowance

INPUT_FORMATS = ("wav", "mp3", "flac", "ogg", "opus", "webm", "m4a", "mp4", "aac", "mpeg", "mpga", "pcm16")


def decode_base64(data, param: str) -> bytes:
    if not isinstance(data, str) or not data:
        raise ApiError(400, "invalid_value", f"{param}: expected base64-encoded audio", param=param)
    try:
        return pcm16.from_base64(data, param)
    except AudioInputError as exc:
        raise ApiError(400, "invalid_base64", str(exc), param=param) from None


def check_input_format(fmt, param: str) -> None:
    """A declared audio format is one of INPUT_FORMATS, else a 400 naming `param`."""
    if fmt not in INPUT_FORMATS:
        raise ApiError(
            400,
            "unsupported_format",
            f"{param}: unsupported audio format {str(fmt)[:40]!r} (supported: {', '.join(INPUT_FORMATS)})",
            param=param,
        )


def speech_from_bytes(
    raw: bytes,
    fmt: str | None,
    audio_config,
    param: str,
    name: str = "audio",
    allowances: Sequence[AudioAllowance] = (),
    silence_ok: bool = False,
) -> np.ndarray:
    """Decode `raw` (format `fmt`, None = probe) to checked 16 kHz speech, no longer than what
    `allowances` have left (decoding stops there: the rest is never read), which it spends;
    `silence_ok`: a silent clip passes (the caller answers it itself).
    It takes a while for a long file: a handler runs it off the event loop (`decoded_speech`)."""
    if fmt is not None:
        check_input_format(fmt, param)
    binding = min(allowances, key=lambda allowance: allowance.left, default=None)
    limit = DurationLimit(audio_config.max_input_seconds, "audio.max_input_seconds")
    if binding is not None and binding.left <= limit.seconds:
        limit = DurationLimit(binding.left, binding.why)
    else:
        binding = None  # the per-input limit comes first: its own error
    try:
        if fmt == "pcm16":
            check_duration(len(pcm16.check_samples(raw, name)) // 2, OPENAI_PCM16_RATE, limit, name)
            pcm = resample(pcm16.to_float(raw, name), OPENAI_PCM16_RATE, SPEECH_INPUT_RATE)
        else:
            pcm = decode_audio_bytes(raw, name=name, limit=limit)
        check_speech_input(pcm, audio_config, silence_ok=silence_ok)
    except AudioTooLongError as exc:
        raise binding.spent_error(param) if binding is not None else _invalid(exc, param) from None
    except AudioInputError as exc:
        raise _invalid(exc, param) from None
    for allowance in allowances:
        allowance.take(pcm.size / SPEECH_INPUT_RATE)
    return pcm


def _invalid(exc: AudioInputError, param: str) -> ApiError:
    return ApiError(400, "invalid_audio", str(exc), param=param)


async def decoded_speech(
    raw: bytes,
    fmt: str | None,
    audio_config,
    param: str,
    name: str = "audio",
    allowances: Sequence[AudioAllowance] = (),
    silence_ok: bool = False,
) -> np.ndarray:
    """speech_from_bytes in a worker thread: the event loop (every session's audio) goes on."""
    return await asyncio.to_thread(speech_from_bytes, raw, fmt, audio_config, param, name, allowances, silence_ok)
