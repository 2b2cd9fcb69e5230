"""A session's input audio buffer (OpenAI's `input_audio_buffer`): the audio a client appends,
at 16 kHz, and what it holds for an explicit commit while turn detection is off.

Appended pcm16 at the session's input rate is one byte stream: an append may end inside a
sample (a client cutting its base64 chunks from a byte stream anywhere), and that byte waits
for the next append to complete it, until input_audio_buffer.clear drops it. The stream is
resampled by one stream resampler, so the edges of the chunks are seamless (`to_16k`). With
the server's VAD the audio goes straight to the VAD; with turn detection off it is kept here
(up to `audio.max_input_seconds`) until the client commits (`take`) or clears it.
"""

from __future__ import annotations

import numpy as np

from kimiaudio.audio import pcm16
from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.audio.resampling import StreamResampler


class InputBuffer:
    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []  # 16 kHz, awaiting a commit
        self._resampler: StreamResampler | None = None
        self._split: bytes = b""  # the first byte of a sample the last append ended inside

    def to_16k(self, raw: bytes, rate: int) -> np.ndarray:
        """pcm16 bytes at `rate` -> 16 kHz float32, continuing the stream appended so far."""
        raw = self._split + raw
        whole = len(raw) - len(raw) % 2
        raw, self._split = raw[:whole], raw[whole:]
        pcm = pcm16.to_float(raw)
        if rate == SPEECH_INPUT_RATE:
            return pcm
        if self._resampler is None or self._resampler.from_sr != rate:
            self._resampler = StreamResampler(rate, SPEECH_INPUT_RATE)
        return self._resampler.push(pcm)

    def keep(self, pcm: np.ndarray, max_samples: int) -> bool:
        """Keep 16 kHz audio for a commit; False (nothing kept) if it would hold more than max_samples."""
        if sum(c.size for c in self._chunks) + pcm.size > max_samples:
            return False
        if pcm.size:  # (an empty append leaves an empty buffer empty: its commit is commit_empty)
            self._chunks.append(np.asarray(pcm, dtype=np.float32))
        return True

    def take(self) -> np.ndarray | None:
        """Everything kept, emptying the buffer; None when it is empty."""
        if not self._chunks:
            return None
        audio, self._chunks = np.concatenate(self._chunks), []
        return audio

    def clear(self) -> None:
        self._chunks, self._split = [], b""
