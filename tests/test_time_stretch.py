"""TimeStretch (audio/time_stretch.py), the answer's audio played at OpenAI's `speed`: as long as
the speed says, at the input's pitch and level, the same however the stream is cut into chunks,
starting as the input starts, and no longer behind the input than its frames need."""

import numpy as np
import pytest

from kimiaudio.audio.resampling import resample
from kimiaudio.audio.time_stretch import MAX_INPUT_LAG_S, MAX_SPEED, MIN_SPEED, TimeStretch

RATE = 24000


def tone(seconds: float, hz: float = 220.0) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def stretched(x: np.ndarray, speed: float, chunks: list[int] | None = None) -> np.ndarray:
    stretch, out, start = TimeStretch(speed, RATE), [], 0
    for size in chunks or [x.size]:
        out.append(stretch.push(x[start : start + size]))
        start += size
    out.append(stretch.push(x[start:]))
    out.append(stretch.flush())
    return np.concatenate(out)


def pitch(x: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.fft.rfftfreq(x.size, 1 / RATE)[np.argmax(spectrum)])


@pytest.mark.parametrize("speed", [MIN_SPEED, 0.5, 0.8, 1.2, MAX_SPEED])
def test_a_tone_keeps_its_pitch_and_level_at_its_new_length(speed):
    x = tone(1.5)
    y = stretched(x, speed)
    assert y.size == round(x.size / speed)
    assert abs(pitch(y) - 220.0) < 2.0  # resampling would move it to 220 x speed
    middle = y[y.size // 4 : 3 * y.size // 4]
    assert np.sqrt(np.mean(middle**2)) == pytest.approx(0.5 / np.sqrt(2), rel=0.03)
    assert np.allclose(y[:200], x[:200], atol=1e-3)  # it starts as the input does, without a fade


@pytest.mark.parametrize("speed", [0.6, 1.3])
def test_the_output_is_the_same_however_the_input_is_chunked(speed):
    x = np.random.default_rng(0).standard_normal(RATE).astype(np.float32) * 0.1
    sizes = list(np.random.default_rng(1).integers(1, 3000, size=40))
    assert np.array_equal(stretched(x, speed, sizes), stretched(x, speed))


@pytest.mark.parametrize("speed", [MIN_SPEED, 1.25, MAX_SPEED])
def test_the_output_lags_the_input_by_no_more_than_its_frames_need(speed):
    """After each chunk, what is out covers all but at most 60 ms of the input so far."""
    stretch, pushed, out = TimeStretch(speed, RATE), 0, 0
    for chunk in np.split(tone(2.0), 50):
        out += stretch.push(chunk).size
        pushed += chunk.size
        assert pushed - out * speed <= MAX_INPUT_LAG_S * RATE, (pushed, out)


def test_speed_one_gives_the_input_back_at_once():
    x = tone(0.3)
    stretch = TimeStretch(1.0, RATE)
    assert np.array_equal(stretch.push(x), x) and stretch.flush().size == 0


@pytest.mark.parametrize("speed", [0.2, 1.6])
def test_a_speed_outside_openais_range_is_refused(speed):
    with pytest.raises(ValueError, match="outside"):
        TimeStretch(speed, RATE)


@pytest.mark.parametrize("speed", [0.5, 0.75, 1.25, 1.5])
def test_speech_keeps_its_level_and_its_spectrum(speech_16k, speed):
    """Each frame is chosen by its likeness to the last one, not by its loudness: the stretched
    speech is as loud as the original, and its spectrum, frame by frame at the mapped time, is
    the original's (resampling instead, which moves the pitch, scores 0.4-0.6 here)."""
    x = resample(speech_16k.astype(np.float32), 16000, RATE)
    y = stretched(x, speed, [1920] * (x.size // 1920))
    assert np.sqrt(np.mean(y**2)) == pytest.approx(np.sqrt(np.mean(x**2)), rel=0.05)

    def log_spectra(a: np.ndarray) -> np.ndarray:
        frames = np.lib.stride_tricks.sliding_window_view(a, 1024)[::256] * np.hanning(1024)
        return np.log(np.abs(np.fft.rfft(frames, axis=1)) + 1e-6)

    original, played = log_spectra(x), log_spectra(y)
    mapped = original[np.minimum(np.round(np.arange(len(played)) * speed).astype(int), len(original) - 1)]
    voiced = (mapped.std(axis=1) > 0.5) & (played.std(axis=1) > 0.5)
    likeness = [np.corrcoef(a, b)[0, 1] for a, b in zip(mapped[voiced], played[voiced])]
    assert np.mean(likeness) > 0.85
