"""Raw pcm16 (little-endian signed 16-bit samples, OpenAI's "pcm16") and its base64 text.

The one codec between float32 audio in [-1, 1] and s16le bytes, and between those bytes and
the base64 text JSON carries them in (Realtime `input_audio_buffer.append`, /v1 input_audio,
`response.audio.delta`). Bytes that cannot be samples raise AudioInputError naming `where`;
each caller answers it as its surface's error.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np

from kimiaudio.errors import AudioInputError

FULL_SCALE_IN = 32768.0  # -32768 -> -1.0 exactly
FULL_SCALE_OUT = 32767.0  # 1.0 -> 32767: clipped audio does not wrap round


def to_bytes(pcm: np.ndarray) -> bytes:
    """Float audio in [-1, 1] (clipped to it) as s16le."""
    return (np.clip(np.asarray(pcm, dtype=np.float32), -1.0, 1.0) * FULL_SCALE_OUT).astype("<i2").tobytes()


def check_samples(raw: bytes, where: str = "audio") -> bytes:
    """`raw` if it is whole 16-bit samples (an even number of bytes)."""
    if len(raw) % 2:
        raise AudioInputError(f"{where}: pcm16 audio must have an even number of bytes")
    return raw


def to_float(raw: bytes, where: str = "audio") -> np.ndarray:
    """s16le bytes as float32 in [-1, 1)."""
    return np.frombuffer(check_samples(raw, where), dtype="<i2").astype(np.float32) / FULL_SCALE_IN


def from_base64(text: str, where: str = "audio") -> bytes:
    """The bytes of strict base64 `text` (any audio: the caller checks what they hold)."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AudioInputError(f"{where}: not valid base64") from None


def to_base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
