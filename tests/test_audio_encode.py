"""The answer's audio encoder (kimiaudio/audio/encode.py): an answer with no audio at all is
still a file its format's decoders read, in every format, whole or streamed."""

import io

import numpy as np
import pytest

from kimiaudio.audio.encode import FORMATS, StreamEncoder, encode_audio

av = pytest.importorskip("av")


def decoded_samples(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as container:
        return sum(frame.samples for frame in container.decode(audio=0))


@pytest.mark.parametrize("fmt", sorted(set(FORMATS) - {"pcm16"}))
def test_an_answer_with_no_audio_is_a_file_its_decoders_read(fmt):
    whole = encode_audio(np.zeros(0, np.float32), fmt, 24000)
    assert decoded_samples(whole) < 24000 * 0.1  # nothing, or the codec's one frame of silence
    encoder = StreamEncoder(fmt, 24000)
    streamed = encoder.push(np.zeros(0, np.float32)) + encoder.finish()
    assert decoded_samples(streamed) < 24000 * 0.1
