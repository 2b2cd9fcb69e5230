"""The one pcm16 codec (audio/pcm16.py): s16le <-> float32, base64 <-> bytes, and the errors
that name what was wrong."""

import numpy as np
import pytest

from kimiaudio.audio import pcm16
from kimiaudio.errors import AudioInputError


def test_round_trip_and_full_scale():
    pcm = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0], np.float32)
    raw = pcm16.to_bytes(pcm)
    assert np.frombuffer(raw, "<i2").tolist() == [0, 16383, -16383, 32767, -32767, 32767, -32767]  # clipped
    back = pcm16.to_float(raw)
    assert back.dtype == np.float32 and np.allclose(back, np.clip(pcm, -1, 1), atol=1 / 32768)
    assert pcm16.to_float(b"\x00\x80")[0] == -1.0  # -32768 is exactly -1
    assert pcm16.from_base64(pcm16.to_base64(raw)) == raw


def test_odd_bytes_and_bad_base64_name_the_field():
    with pytest.raises(AudioInputError, match="item.audio: pcm16 audio must have an even number of bytes"):
        pcm16.to_float(b"\x00\x01\x02", "item.audio")
    with pytest.raises(AudioInputError, match="item.audio: pcm16"):
        pcm16.check_samples(b"\x00", "item.audio")
    for text in ("not base64!", "AAA", "AA=A"):
        with pytest.raises(AudioInputError, match="data: not valid base64"):
            pcm16.from_base64(text, "data")
