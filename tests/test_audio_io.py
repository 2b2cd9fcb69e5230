"""kimiaudio.audio.io: decoding of common formats, resampling, WAV writing, input checks."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import soundfile

from kimiaudio.audio.io import DurationLimit, check_speech_input, decode_audio_bytes, load_audio, wav_bytes, write_wav
from kimiaudio.audio.resampling import StreamResampler, resample
from kimiaudio.config import AudioConfig
from kimiaudio.errors import AudioInputError, AudioTooLongError


def sine(freq: float, sr: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(sr * seconds))) / sr
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_frequency(pcm: np.ndarray, sr: int) -> float:
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    return float(np.argmax(spectrum) * sr / len(pcm))


def test_wav_round_trip(tmp_path):
    pcm = sine(440, 16000, 0.5)
    path = tmp_path / "a.wav"
    write_wav(path, pcm, 16000)
    info = soundfile.info(str(path))
    assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
    back = load_audio(path)
    assert back.dtype == np.float32 and back.shape == pcm.shape
    np.testing.assert_allclose(back, pcm, atol=1.5 / 32768)
    np.testing.assert_allclose(decode_audio_bytes(wav_bytes(pcm, 16000)), back, atol=0)


def test_write_wav_clips_instead_of_wrapping(tmp_path):
    path = tmp_path / "loud.wav"
    write_wav(path, np.array([2.0, -2.0, 0.5], dtype=np.float32), 16000)
    data, _ = soundfile.read(str(path), dtype="float32")
    assert data[0] > 0.99 and data[1] < -0.99


def test_stereo_flac_44k_is_mixed_to_mono_16k(tmp_path):
    left, right = sine(440, 44100, 1.0, 0.5), sine(440, 44100, 1.0, 0.3)
    path = tmp_path / "stereo.flac"
    soundfile.write(str(path), np.stack([left, right], axis=1), 44100, format="FLAC")
    pcm = load_audio(path)
    assert pcm.dtype == np.float32 and pcm.ndim == 1
    assert abs(len(pcm) - 16000) <= 1
    assert abs(peak_frequency(pcm, 16000) - 440) < 2
    # averaging the channels: amplitude (0.5 + 0.3) / 2
    assert abs(np.max(np.abs(pcm[1000:-1000])) - 0.4) < 0.01


def test_files_joined_with_other_channels_are_mixed_to_mono(tmp_path):
    """A mono FLAC and a stereo one joined end to end (`cat`): both halves, each mixed to mono."""
    mono, stereo = tmp_path / "mono.flac", tmp_path / "stereo.flac"
    soundfile.write(str(mono), sine(440, 16000, 1.0, 0.5), 16000, format="FLAC")
    soundfile.write(str(stereo), np.stack([sine(440, 16000, 1.0, 0.2)] * 2, axis=1), 16000, format="FLAC")
    joined = tmp_path / "joined.flac"
    joined.write_bytes(mono.read_bytes() + stereo.read_bytes())
    pcm = load_audio(joined)
    assert 32000 - 4096 <= len(pcm) <= 32000  # (the second file's first block, 4096, may go at the seam)
    first, second = np.abs(pcm[1000:15000]).max(), np.abs(pcm[-10000:-1000]).max()
    assert abs(first - 0.5) < 0.01 and abs(second - 0.2) < 0.01, (first, second)


@pytest.mark.parametrize("channels", [8, 16])
def test_many_channels_are_mixed_to_mono(tmp_path, channels):
    """(PyAV's planar frames of 8 or more channels crashed the process when read.)"""
    amplitudes = np.linspace(0.1, 0.8, channels)
    path = tmp_path / "many.wav"
    soundfile.write(str(path), np.stack([sine(300, 16000, 1.0, a) for a in amplitudes], axis=1), 16000)
    pcm = load_audio(path)
    assert pcm.shape == (16000,) and abs(peak_frequency(pcm, 16000) - 300) < 2
    assert abs(np.max(np.abs(pcm)) - amplitudes.mean()) < 0.01


@pytest.mark.parametrize(
    "fmt,subtype,sr",
    [("MP3", "MPEG_LAYER_III", 48000), ("OGG", "VORBIS", 22050), ("OGG", "OPUS", 48000)],
)
def test_compressed_formats_decode_to_16k(tmp_path, fmt, subtype, sr):
    path = tmp_path / f"a.{fmt.lower()}"
    soundfile.write(str(path), sine(1000, sr, 1.0), sr, format=fmt, subtype=subtype)
    pcm = load_audio(path)
    # Codecs add a little priming/padding; the length must still be 1 s at 16 kHz.
    assert abs(len(pcm) - 16000) < 0.06 * 16000
    assert abs(peak_frequency(pcm, 16000) - 1000) < 3
    assert 0.3 < np.max(np.abs(pcm)) < 0.7
    from_bytes = decode_audio_bytes(path.read_bytes())
    np.testing.assert_allclose(from_bytes, pcm, atol=1e-6)


@pytest.mark.parametrize("from_sr,to_sr,freq", [(48000, 16000, 1000.0), (24000, 48000, 3000.0), (44100, 16000, 440.0)])
def test_resample_keeps_frequency_and_length(from_sr, to_sr, freq):
    pcm = sine(freq, from_sr, 1.0)
    out = resample(pcm, from_sr, to_sr)
    assert out.dtype == np.float32 and len(out) == to_sr
    assert abs(peak_frequency(out, to_sr) - freq) < 2
    # aligned in time (no filter delay left in the output)
    np.testing.assert_allclose(out[200:-200], sine(freq, to_sr, 1.0)[200:-200], atol=2e-3)


def test_resample_same_rate_is_a_copy():
    pcm = sine(100, 16000, 0.1)
    out = resample(pcm, 16000, 16000)
    np.testing.assert_array_equal(out, pcm)
    assert out is not pcm


@pytest.mark.parametrize("from_sr,to_sr", [(48000, 16000), (24000, 48000)])
def test_stream_resampler_matches_one_shot(from_sr, to_sr):
    rng = np.random.default_rng(0)
    pcm = (0.3 * rng.standard_normal(from_sr)).astype(np.float32)
    one_shot = resample(pcm, from_sr, to_sr)
    stream = StreamResampler(from_sr, to_sr)
    pieces, start = [], 0
    while start < len(pcm):
        size = int(rng.integers(1, 1500))
        pieces.append(stream.push(pcm[start : start + size]))
        start += size
    pieces.append(stream.flush())
    chunked = np.concatenate(pieces)
    assert len(chunked) == len(one_shot)
    np.testing.assert_allclose(chunked, one_shot, atol=1e-5)


def test_stream_resampler_low_latency():
    stream = StreamResampler(48000, 16000)
    out = [len(stream.push(np.zeros(960, np.float32))) for _ in range(3)]  # 20 ms frames
    assert out[0] >= 300 and out[1:] == [320, 320]


def test_check_speech_input_accepts_speech_like_audio():
    check_speech_input(sine(200, 16000, 1.0, 0.1), AudioConfig())


@pytest.mark.parametrize(
    "pcm,cfg,words",
    [
        (np.zeros(0, np.float32), AudioConfig(), "empty"),
        (np.zeros(16000, np.float32), AudioConfig(), "silent"),
        (sine(200, 16000, 1.0, 1e-4), AudioConfig(silence_peak=1e-3), "audio.silence_peak"),
        (sine(200, 16000, 2.5), AudioConfig(max_input_seconds=2.0), "audio.max_input_seconds"),
        (np.array([0.5, np.nan], np.float32), AudioConfig(), "NaN"),
        (sine(200, 16000, 1.0, 1e30), AudioConfig(), r"reaches 1e\+30: float samples must lie in \[-1, 1\]"),
    ],
)
def test_check_speech_input_refuses(pcm, cfg, words):
    with pytest.raises(AudioInputError, match=words):
        check_speech_input(pcm, cfg)


def test_too_long_message_names_the_limit():
    with pytest.raises(AudioInputError) as info:
        check_speech_input(sine(200, 16000, 2.5), AudioConfig(max_input_seconds=2.0))
    assert "2.5 s" in str(info.value) and "limit is 2 s" in str(info.value)


def test_decoding_stops_past_the_limit():
    """Ten minutes of one level compress to a few kilobytes of FLAC: decoding stops once it is
    past the limit, the rest never decoded (hours would take gigabytes)."""
    buffer = io.BytesIO()
    soundfile.write(buffer, np.full(8000 * 600, 0.25, np.float32), 8000, subtype="PCM_16", format="FLAC")
    data = buffer.getvalue()
    assert len(data) < 200_000
    with pytest.raises(AudioTooLongError, match=r"longer than 5 s, the limit \(audio.max_input_seconds\)"):
        decode_audio_bytes(data, name="upload", limit=DurationLimit(5.0, "audio.max_input_seconds"))


def test_garbage_bytes_and_files(tmp_path):
    garbage = bytes(np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8))
    with pytest.raises(AudioInputError, match="not a readable audio file"):
        decode_audio_bytes(garbage, name="upload.wav")
    with pytest.raises(AudioInputError, match="empty"):
        decode_audio_bytes(b"")
    path = tmp_path / "broken.wav"
    path.write_bytes(garbage)
    with pytest.raises(AudioInputError, match="broken.wav"):
        load_audio(path)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(AudioInputError, match="nothere.flac: audio file not found"):
        load_audio(tmp_path / "nothere.flac")
    with pytest.raises(AudioInputError, match=f"{re.escape(str(tmp_path))}: a directory, not an audio file"):
        load_audio(tmp_path)


def test_a_rate_too_high_to_leave_a_sample_says_so(tmp_path):
    path = tmp_path / "fast.wav"
    soundfile.write(str(path), np.full(2, 0.5, np.float32), 768_000)
    with pytest.raises(AudioInputError, match="2 samples at 768000 Hz are less than one sample at 16000 Hz"):
        load_audio(path)


@pytest.mark.parametrize("rate", [768_001, 1 << 30])
def test_a_rate_above_what_is_taken_is_refused_before_decoding(tmp_path, rate):
    """A header may claim any rate: one far above real audio's would set FFmpeg's resampler up
    for seconds, and let hours of samples under a duration limit counted at that rate."""
    path = tmp_path / "fast.wav"
    soundfile.write(str(path), np.full(1000, 0.5, np.float32), rate)
    with pytest.raises(AudioInputError, match=rf"fast.wav: its sample rate \({rate} Hz\) is above 768000 Hz"):
        load_audio(path)
    with pytest.raises(AudioInputError, match=rf"upload.wav: its sample rate \({rate} Hz\) is above 768000 Hz"):
        decode_audio_bytes(path.read_bytes(), name="upload.wav", limit=DurationLimit(1.0, "audio.max_input_seconds"))


def test_file_without_audio_stream(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is not audio\n" * 50)
    with pytest.raises(AudioInputError, match="notes.txt"):
        load_audio(path)


def test_absurd_header_sample_rate_is_an_input_error():
    """A WAV header may claim any rate; one far above real audio's is the upload's fault, named."""
    wav = bytearray(wav_bytes(np.full(1600, 0.1, np.float32), 16000))
    wav[24:28] = (2**31 - 1).to_bytes(4, "little")  # the fmt chunk's sample rate
    with pytest.raises(AudioInputError, match=r"upload.wav: its sample rate \(2147483647 Hz\)"):
        decode_audio_bytes(bytes(wav), name="upload.wav")
