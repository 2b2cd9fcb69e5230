"""NoiseReduction (audio/noise_reduction.py), OpenAI's `audio.input.noise_reduction`: on speech
with a steady noise under it, the noise alone comes out lower and the speech's SNR higher;
clean speech is left as it was; far_field lowers the noise further than near_field; the output
is as long as the input and the same however the input is chunked, and a flush gives the rest
without teaching the noise estimate that the padding is the room."""

import numpy as np
import pytest

from kimiaudio.audio.noise_reduction import FRAME, NoiseReduction

RATE = 16000


@pytest.fixture(scope="module")
def clean(speech_16k) -> np.ndarray:
    """The test sentence after a second of silence, peaking at 0.5."""
    x = np.concatenate([np.zeros(RATE, np.float32), speech_16k.astype(np.float32)])
    return x / np.abs(x).max() * 0.5


def db(x: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(x**2) + 1e-20))


def reduced(x: np.ndarray, kind: str, chunks: list[int] | None = None) -> np.ndarray:
    nr, out, start = NoiseReduction(kind), [], 0
    for size in chunks or []:
        out.append(nr.push(x[start : start + size]))
        start += size
    out += [nr.push(x[start:]), nr.flush()]
    return np.concatenate(out)


def speaking(clean: np.ndarray) -> np.ndarray:
    """Where the clean speech is louder than 30 dB below its loudest 20 ms (a mask per sample)."""
    energy = np.array([np.mean(clean[i : i + 320] ** 2) for i in range(0, clean.size, 320)])
    return np.repeat(energy > energy.max() * 1e-3, 320)[: clean.size]


def noisy(clean: np.ndarray, snr_db: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(speech + white noise at snr_db over the speech, the noise)."""
    noise = np.random.default_rng(seed).standard_normal(clean.size).astype(np.float32)
    noise *= np.sqrt(np.mean(clean[speaking(clean)] ** 2) / np.mean(noise**2)) * 10 ** (-snr_db / 20)
    return clean + noise, noise


@pytest.mark.parametrize("snr_db", [0.0, 10.0])
def test_noise_under_speech_is_turned_down(clean, snr_db):
    x, _ = noisy(clean, snr_db)
    on = speaking(clean)
    lowered = {}
    for kind in ("near_field", "far_field"):
        y = reduced(x, kind)
        assert y.size == x.size
        snr_out = db(clean[on]) - db((y - clean)[on])
        assert snr_out > snr_db + 2.0, (kind, snr_out)  # (measured: +6.3 dB at 0, +2.8 at 10)
        lowered[kind] = db(x[~on]) - db(y[~on])
    assert lowered["near_field"] > 8.0 and lowered["far_field"] > lowered["near_field"] + 2.0, lowered


def test_clean_speech_is_left_as_it_was(clean):
    y = reduced(clean, "near_field")
    on = speaking(clean)
    assert abs(db(y[on]) - db(clean[on])) < 0.5
    assert db(clean[on]) - db((y - clean)[on]) > 18.0  # (measured: 23 dB)


def test_the_output_is_the_same_however_the_input_is_chunked(clean):
    x, _ = noisy(clean[: 2 * RATE], 5.0)
    sizes = [int(n) for n in np.random.default_rng(1).integers(1, 1500, size=30)]
    assert np.array_equal(reduced(x, "far_field", sizes), reduced(x, "far_field"))


def test_a_flush_gives_the_rest_and_keeps_the_noise_estimate(clean):
    """Two stretches through one reducer, each flushed (committed): each comes out whole, and the
    second is cleaned from its first frame: the silence a flush pads with does not make the
    noise estimate that of a silent room."""
    x, _ = noisy(clean, 5.0)
    nr = NoiseReduction("near_field")
    first = np.concatenate([nr.push(x[: RATE // 2]), nr.flush()])  # (noise alone)
    second = np.concatenate([nr.push(x[: FRAME * 4]), nr.flush()])
    assert first.size == RATE // 2 and second.size == FRAME * 4
    assert db(x[: FRAME * 4]) - db(second) > 6.0


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="near_field, far_field"):
        NoiseReduction("studio")
