"""Audio file and buffer I/O: decode anything to float32 mono at the rate asked, write files,
validate.

Decoding uses PyAV (FFmpeg), so every common container and codec works (wav, flac, ogg/vorbis,
opus, mp3, m4a, webm). Channels are mixed to mono by averaging, then resampled (resampling.py).
The official Kimi code loads audio with librosa (soxr); the resampler differs in the last
bits, which the models do not notice. Every failure is an AudioInputError naming the input.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import NamedTuple

import numpy as np

from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.audio.resampling import as_mono_float32, resample
from kimiaudio.errors import AudioInputError, AudioTooLongError, KimiAudioError

# The largest sample magnitude taken: float files may overshoot full scale a little; far past
# it the input is broken, not loud.
MAX_SAMPLE_PEAK = 64.0
# The highest input rate taken: that of the common PCM formats. A header may claim any rate, and
# FFmpeg's resampler sets up a filter that grows with the ratio of the rates (from 2**30 Hz to
# 16 kHz it computed for 12 s, for a file of 1,000 samples); an absurd rate would also let hours
# of samples under the duration limit, which counts seconds at the claimed rate.
MAX_INPUT_RATE = 768_000


def load_audio(path: str | Path, sr: int = SPEECH_INPUT_RATE) -> np.ndarray:
    """Decode an audio file to float32 mono at `sr` Hz."""
    path = Path(path)
    if not path.is_file():
        raise AudioInputError(
            f"{path}: {'a directory, not an audio file' if path.is_dir() else 'audio file not found'}"
        )
    return _decode(str(path), str(path), sr)


class DurationLimit(NamedTuple):
    """The longest audio a decode takes, and the config key that sets it (named in the error)."""

    seconds: float
    key: str


def check_duration(num_samples: int, rate: int, limit: DurationLimit | None, name: str) -> None:
    """AudioTooLongError once `num_samples` at `rate` Hz last longer than `limit` (None: no limit)."""
    if limit is not None and num_samples > limit.seconds * rate:
        raise AudioTooLongError(f"{name}: longer than {limit.seconds:g} s, the limit ({limit.key})")


def decode_audio_bytes(
    data: bytes, sr: int = SPEECH_INPUT_RATE, name: str = "audio data", limit: DurationLimit | None = None
) -> np.ndarray:
    """Decode an encoded audio file held in memory (e.g. an upload) to float32 mono at `sr` Hz;
    with a `limit`, decoding stops as soon as the audio is longer (a few compressed kilobytes
    can hold hours of audio, gigabytes once decoded)."""
    if not data:
        raise AudioInputError(f"{name}: empty (0 bytes)")
    return _decode(io.BytesIO(data), name, sr, limit)


# A written file's suffix -> its format (audio/encode.py's names); no suffix is WAV.
SUFFIX_FORMATS = {
    "": "wav",
    ".wav": "wav",
    ".mp3": "mp3",
    ".flac": "flac",
    ".ogg": "opus",
    ".opus": "opus",
    ".aac": "aac",
}


def file_format(path: str | Path) -> str:
    """The format a file named `path` is written in, from its suffix; KimiAudioError for a
    suffix no encoder here writes (a reply is never written in a format its name belies)."""
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIX_FORMATS:
        known = ", ".join(s for s in SUFFIX_FORMATS if s)
        raise KimiAudioError(f"{path}: {suffix} is no audio format written here; name the file {known}")
    return SUFFIX_FORMATS[suffix]


def write_audio(path: str | Path, pcm: np.ndarray, sr: int) -> None:
    """Write mono float audio in the format its name says (WAV: 16-bit PCM, clipped to
    [-1, 1]); KimiAudioError naming the file when it cannot be written. The file is written
    beside `path` and renamed onto it once whole, so a failed write (a full disk) leaves no
    truncated file, and a file already there stays as it was."""
    from kimiaudio.audio.encode import encode_audio

    data = encode_audio(pcm, file_format(path), sr)
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_bytes(data)
        partial.replace(path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise KimiAudioError(f"{path}: cannot be written ({exc.strerror or exc})") from None


def write_wav(path: str | Path, pcm: np.ndarray, sr: int) -> None:
    """Write mono float audio as 16-bit PCM WAV (clipped to [-1, 1]); KimiAudioError naming the
    file when it cannot be written."""
    import soundfile

    try:
        soundfile.write(str(path), _to_pcm16_range(pcm), int(sr), subtype="PCM_16", format="WAV")
    except (soundfile.LibsndfileError, OSError) as exc:
        raise KimiAudioError(f"{path}: cannot be written ({exc})") from None


def wav_bytes(pcm: np.ndarray, sr: int) -> bytes:
    """The bytes of a 16-bit PCM WAV file holding mono float audio."""
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, _to_pcm16_range(pcm), int(sr), subtype="PCM_16", format="WAV")
    return buffer.getvalue()


def peak_level(pcm: np.ndarray) -> float:
    """The largest magnitude of a non-empty clip; AudioInputError for samples no feature can be
    computed from: NaN, infinite, or far outside [-1, 1] (a float file's samples of 1e17 or
    more overflow the log-mel's power spectrum)."""
    if not np.all(np.isfinite(pcm)):
        raise AudioInputError("audio input contains NaN or infinite samples")
    peak = float(np.max(np.abs(pcm)))
    if peak > MAX_SAMPLE_PEAK:
        raise AudioInputError(
            f"audio input reaches {peak:.3g}: float samples must lie in [-1, 1] (up to {MAX_SAMPLE_PEAK:g} is taken)"
        )
    return peak


def is_silent(pcm: np.ndarray, audio_cfg) -> bool:
    """Nothing said: the clip's peak stays under audio.silence_peak (an empty clip too)."""
    return np.size(pcm) == 0 or peak_level(pcm) < audio_cfg.silence_peak


def check_speech_input(pcm: np.ndarray, audio_cfg, sr: int = SPEECH_INPUT_RATE, silence_ok: bool = False) -> None:
    """Refuse input the models cannot use: empty, non-finite, out of range, too long, or silent
    (unless `silence_ok`: a silence meant to be answered, as an idle timeout's)."""
    pcm = np.asarray(pcm)
    if pcm.size == 0:
        raise AudioInputError("audio input is empty (0 samples)")
    peak = peak_level(pcm)
    seconds = pcm.size / sr
    if seconds > audio_cfg.max_input_seconds:
        raise AudioInputError(
            f"audio input is {seconds:.1f} s long; the limit is {audio_cfg.max_input_seconds:g} s "
            f"(config key audio.max_input_seconds)"
        )
    if not silence_ok and peak < audio_cfg.silence_peak:
        raise AudioInputError(
            f"audio input is silent (peak {peak:.2g} is below audio.silence_peak = {audio_cfg.silence_peak:g})"
        )


def _decode(source, name: str, sr: int, limit: DurationLimit | None = None) -> np.ndarray:
    import av

    try:
        with av.open(source, mode="r") as container:
            stream = next((s for s in container.streams if s.type == "audio"), None)
            if stream is None:
                raise AudioInputError(f"{name}: no audio stream found")
            # Format conversion only (same rate and layout): any sample format -> interleaved
            # float, averaged to mono here. (Planar frames of 8 or more channels crash PyAV's
            # to_ndarray: a segfault, which took the server down.)
            to_float = av.AudioResampler(format="flt")
            chunks: list[np.ndarray] = []
            rate, num_samples, damaged, kind = None, 0, 0, None
            for frame in _frames(container, stream):
                if frame is None:
                    damaged += 1
                    continue
                if rate is not None and frame.sample_rate != rate:
                    raise AudioInputError(f"{name}: the sample rate changes inside the stream")
                rate = frame.sample_rate
                if rate > MAX_INPUT_RATE:  # (before its samples count against the duration limit)
                    raise AudioInputError(f"{name}: its sample rate ({rate} Hz) is above {MAX_INPUT_RATE} Hz")
                if kind is not None and (frame.layout.name, frame.format.name) != kind:
                    # Files joined end to end (mono then stereo, say): players remix the rest, and
                    # so does this decoding, through a converter set up for it.
                    chunks += [_mono(f) for f in to_float.resample(None)]
                    to_float = av.AudioResampler(format="flt")
                kind = (frame.layout.name, frame.format.name)
                chunks += [_mono(f) for f in to_float.resample(frame)]
                num_samples += frame.samples
                check_duration(num_samples, rate, limit, name)  # frame by frame: the rest is never decoded
            chunks += [_mono(f) for f in to_float.resample(None)]
            if damaged and rate is None:
                raise AudioInputError(f"{name}: not a readable audio file (none of its {damaged} packets decodes)")
    except AudioInputError:  # (AudioTooLongError too)
        raise
    except (av.FFmpegError, OSError, ValueError, EOFError, RuntimeError) as exc:
        raise AudioInputError(f"{name}: not a readable audio file ({type(exc).__name__}: {exc})") from None
    if not chunks:
        return np.zeros(0, dtype=np.float32)
    pcm = np.concatenate(chunks).astype(np.float32, copy=False)
    if rate is None or rate == sr:  # (None: no frame, and so no samples)
        return pcm
    if pcm.size * sr < rate:
        raise _too_short(name, pcm.size, rate, sr)
    try:
        resampled = resample(pcm, rate, sr)
    except av.FFmpegError as exc:  # a rate FFmpeg cannot convert from (none of the usual ones)
        raise AudioInputError(
            f"{name}: its sample rate ({rate} Hz) cannot be converted to {sr} Hz ({type(exc).__name__}: {exc})"
        ) from None
    if pcm.size and not resampled.size:  # (the resampler's delay kept the one sample there was)
        raise _too_short(name, pcm.size, rate, sr)
    return resampled


def _frames(container, stream):
    """The stream's decoded frames, and None for each packet that does not decode. Players skip
    such a packet (the last one of a file cut short, the tag of a second file joined to the
    first) and play the rest, and so does this decoding."""
    import av

    for packet in container.demux(stream):
        try:
            frames = packet.decode()
        except av.InvalidDataError:
            yield None
            continue
        yield from frames


def _too_short(name: str, samples: int, rate: int, sr: int) -> AudioInputError:
    """Said of a file too short for one sample at `sr`: "empty" alone would blame its samples."""
    return AudioInputError(f"{name}: {samples} samples at {rate} Hz are less than one sample at {sr} Hz")


def _mono(frame) -> np.ndarray:
    """An interleaved float frame ([1, n * channels]) as the mean of its channels ([n])."""
    return frame.to_ndarray().reshape(-1, len(frame.layout.channels)).mean(axis=1)


def _to_pcm16_range(pcm: np.ndarray) -> np.ndarray:
    return np.clip(as_mono_float32(pcm), -1.0, 1.0)
