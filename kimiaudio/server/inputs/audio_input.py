"""Audio a /v1 request brings (an upload, a base64 input_audio part), decoded and checked.

Any container PyAV reads is taken (wav, mp3, flac, ogg/opus, webm, m4a/aac...; the format
is probed from the bytes, a declared format is only checked to be one of those), plus raw
`pcm16` (little-endian 16-bit mono at 24 kHz, what OpenAI's pcm16 means). The result is
16 kHz float32 mono that passed the same checks as every other input (not empty, not
silent, not longer than audio.max_input_seconds); every failure is a 400 naming the field.
"""

from __future__ import annotations

import asyncio

import numpy as np

from kimiaudio.audio import pcm16
from kimiaudio.audio.io import DurationLimit, check_speech_input, decode_audio_bytes, resample
from kimiaudio.audio.rates import OPENAI_PCM16_RATE, SPEECH_INPUT_RATE
from kimiaudio.errors import AudioInputError
from kimiaudio.server.api_error import ApiError

INPUT_FORMATS = ("wav", "mp3", "flac", "ogg", "opus", "webm", "m4a", "mp4", "aac", "mpeg", "mpga", "pcm16")


def decode_base64(data, param: str) -> bytes:
    if not isinstance(data, str) or not data:
        raise ApiError(400, "invalid_value", f"{param}: expected base64-encoded audio", param=param)
    try:
        return pcm16.from_base64(data, param)
    except AudioInputError as exc:
        raise ApiError(400, "invalid_base64", str(exc), param=param) from None


def speech_from_bytes(raw: bytes, fmt: str | None, audio_config, param: str, name: str = "audio") -> np.ndarray:
    """Decode `raw` (format `fmt`, None = probe) to checked 16 kHz speech. It takes a while for
    a long file: a handler runs it off the event loop (`decoded_speech`)."""
    if fmt is not None and fmt not in INPUT_FORMATS:
        raise ApiError(
            400,
            "unsupported_format",
            f"{param}: unsupported audio format {str(fmt)[:40]!r} (supported: {', '.join(INPUT_FORMATS)})",
            param=param,
        )
    try:
        if fmt == "pcm16":
            pcm = resample(pcm16.to_float(raw, name), OPENAI_PCM16_RATE, SPEECH_INPUT_RATE)
        else:
            pcm = decode_audio_bytes(
                raw, name=name, limit=DurationLimit(audio_config.max_input_seconds, "audio.max_input_seconds")
            )
        check_speech_input(pcm, audio_config)
    except AudioInputError as exc:
        raise ApiError(400, "invalid_audio", str(exc), param=param) from None
    return pcm


async def decoded_speech(raw: bytes, fmt: str | None, audio_config, param: str, name: str = "audio") -> np.ndarray:
    """speech_from_bytes in a worker thread: the event loop (every session's audio) goes on."""
    return await asyncio.to_thread(speech_from_bytes, raw, fmt, audio_config, param, name)
