"""Encoding the assistant's 24 kHz speech for clients: wav, mp3, opus, aac, flac, raw pcm16.

`StreamEncoder` takes float32 mono chunks as the pipeline makes them and returns the encoded
bytes the container has ready after each one, so an answer can be streamed while it is being
generated. PyAV (FFmpeg) encodes into a write-only sink, which FFmpeg treats as a
non-seekable stream: mp3 (libmp3lame), opus in Ogg (pages of at most OGG_PAGE_US), aac in
ADTS, FLAC and raw s16le all stream. WAV cannot be both streamed and exact (its header holds
the length): a streamed WAV starts with a header whose sizes say "unknown" (0xFFFFFFFF, as
FFmpeg and most players accept), and `encode_audio` (a whole answer) writes an exact one.
An answer with no audio at all is still a file its format's decoders read: WAV and FLAC are
their headers alone; MP3 and ADTS have no header without a frame, and Ogg writes none without
a packet, so they hold one sample of silence (the codec's one frame, a few tens of ms).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import numpy as np

from kimiaudio.audio import pcm16
from kimiaudio.errors import KimiAudioError

if TYPE_CHECKING:
    from av import AudioFrame, AudioStream
    from av.container import OutputContainer

# format -> (container, codec, MIME type); "wav" and "pcm16" are written here without PyAV.
FORMATS = {
    "mp3": ("mp3", "libmp3lame", "audio/mpeg"),
    "opus": ("ogg", "libopus", "audio/ogg"),
    "aac": ("adts", "aac", "audio/aac"),
    "flac": ("flac", "flac", "audio/flac"),
    "wav": (None, None, "audio/wav"),
    "pcm16": (None, None, "audio/pcm"),
}
OGG_PAGE_US = 100_000  # Ogg pages of 100 ms: opus streams instead of waiting for 1 s pages


def wav_header(sample_rate: int, num_samples: int | None) -> bytes:
    """A 44-byte 16-bit mono PCM WAV header; num_samples None: sizes unknown (streaming)."""
    data = 0xFFFFFFFF if num_samples is None else 2 * num_samples
    riff = 0xFFFFFFFF if num_samples is None else 36 + data
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        riff,
        b"WAVE",
        b"fmt ",
        16,
        1,
        1,
        sample_rate,
        2 * sample_rate,
        2,
        16,
        b"data",
        data,
    )


class _Sink:
    """A write-only file for PyAV: what the muxer wrote since the last drain."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def drain(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


class StreamEncoder:
    def __init__(self, fmt: str, sample_rate: int):
        if fmt not in FORMATS:
            raise KimiAudioError(f"unsupported audio format {fmt!r} (supported: {', '.join(FORMATS)})")
        self.format = fmt
        self.sample_rate = sample_rate
        self.mime_type = FORMATS[fmt][2]
        self._started = False
        self._encoded = False  # samples went into the codec
        self._sink = _Sink()
        self._muxer: tuple[OutputContainer, AudioStream] | None = None  # None: written here, without PyAV
        container, codec, _ = FORMATS[fmt]
        if container is not None and codec is not None:
            import av

            options = {"page_duration": str(OGG_PAGE_US)} if container == "ogg" else {}
            out = av.open(self._sink, "w", format=container, options=options)
            stream = out.add_stream(codec, rate=sample_rate, layout="mono")
            if not isinstance(stream, av.AudioStream):
                raise KimiAudioError(f"{codec}: PyAV made no audio stream for it")
            self._muxer = (out, stream)

    def push(self, pcm: np.ndarray) -> bytes:
        """Encode one chunk; returns the bytes ready now (possibly none)."""
        head = b""
        if not self._started:
            self._started = True
            head = wav_header(self.sample_rate, None) if self.format == "wav" else b""
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if self._muxer is None:
            return head + pcm16.to_bytes(pcm)
        if pcm.size:
            self._mux(self._muxer, self._frame(pcm))
            self._encoded = True
        return head + self._sink.drain()

    def finish(self) -> bytes:
        """The rest: what the encoder held back, and the container's trailer."""
        head = b"" if self._started else self.push(np.zeros(0, np.float32))
        if self._muxer is None:
            return head
        if not self._encoded and self.format != "flac":  # (the module docstring: no empty file)
            self._mux(self._muxer, self._frame(np.zeros(1, np.float32)))
        self._mux(self._muxer, None)
        self._muxer[0].close()
        return head + self._sink.drain()

    def _frame(self, pcm: np.ndarray) -> AudioFrame:
        import av

        frame = av.AudioFrame.from_ndarray(np.clip(pcm, -1.0, 1.0)[None, :], format="flt", layout="mono")
        frame.sample_rate = self.sample_rate
        return frame

    @staticmethod
    def _mux(muxer: tuple[OutputContainer, AudioStream], frame: AudioFrame | None) -> None:
        container, stream = muxer
        for packet in stream.encode(frame):
            container.mux(packet)


def encode_audio(pcm: np.ndarray, fmt: str, sample_rate: int) -> bytes:
    """A whole answer as one file (a WAV with exact sizes)."""
    if fmt == "wav":
        return wav_header(sample_rate, int(np.size(pcm))) + pcm16.to_bytes(pcm)
    encoder = StreamEncoder(fmt, sample_rate)
    return encoder.push(pcm) + encoder.finish()
