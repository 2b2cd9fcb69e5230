"""Audio a /v1 request brings (an upload, a base64 input_audio part), decoded and checked.

Any container PyAV reads is taken (wav, mp3, flac, ogg/opus, webm, m4a/aac...; the format
is probed from the bytes, a declared format is only checked to be one of those), plus raw
`pcm16` (little-endian 16-bit mono at 24 kHz, what OpenAI's pcm16 means). The result is
16 kHz float32 mono that passed the same checks as every other input (not empty, not
silent, not longer than audio.max_input_seconds); every failure is a 400 naming the field.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np

from kimiaudio.audio.io import check_speech_input, decode_audio_bytes, resample
from kimiaudio.audio.rates import OPENAI_PCM16_RATE, SPEECH_INPUT_RATE
from kimiaudio.errors import AudioInputError
from kimiaudio.server.v1.errors import V1Error

INPUT_FORMATS = ("wav", "mp3", "flac", "ogg", "opus", "webm", "m4a", "mp4", "aac", "mpeg", "mpga", "pcm16")


def decode_base64(data, param: str) -> bytes:
    if not isinstance(data, str) or not data:
        raise V1Error(400, f"{param}: expected base64-encoded audio", "invalid_value", param)
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise V1Error(400, f"{param}: not valid base64", "invalid_base64", param) from None


def speech_from_bytes(raw: bytes, fmt: str | None, audio_config, param: str, name: str = "audio") -> np.ndarray:
    """Decode `raw` (format `fmt`, None = probe) to checked 16 kHz speech."""
    if fmt is not None and fmt not in INPUT_FORMATS:
        raise V1Error(400, f"{param}: unsupported audio format {str(fmt)[:40]!r} (supported: {', '.join(INPUT_FORMATS)})",
                      "unsupported_format", param)
    try:
        if fmt == "pcm16":
            if len(raw) % 2:
                raise AudioInputError(f"{name}: pcm16 audio must have an even number of bytes")
            pcm = resample(np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0, OPENAI_PCM16_RATE, SPEECH_INPUT_RATE)
        else:
            pcm = decode_audio_bytes(raw, name=name)
        check_speech_input(pcm, audio_config)
    except AudioInputError as exc:
        raise V1Error(400, str(exc), "invalid_audio", param) from None
    return pcm
