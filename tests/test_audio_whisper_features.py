"""Whisper log-mel and continuous features against the official goldens (tiny checkpoint)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kimiaudio.audio.log_mel import MelSettings, log_mel_spectrogram, split_segments
from kimiaudio.audio.whisper_features import WhisperFeatureEncoder
from kimiaudio.checkpoint.paths import CheckpointPaths

GOLDEN = Path(__file__).parent / "data" / "golden_a"
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def encoder():
    root = GOLDEN / "checkpoint"
    return WhisperFeatureEncoder.load(CheckpointPaths(root, root / "glm-4-voice-tokenizer"), "cpu", torch.float32)


def test_mel_matches_official(golden):
    settings = MelSettings.from_preprocessor_config(GOLDEN / "checkpoint/whisper-large-v3/preprocessor_config.json", 128)
    wav = golden["wav16k"][0]
    padded = torch.nn.functional.pad(wav, (0, settings.segment_samples - len(wav)))[None]  # pad_or_trim
    mel = log_mel_spectrogram(padded, settings.filters(), settings)[0]
    assert mel.shape == golden["whisper.mel"].shape == (128, 3000)
    torch.testing.assert_close(mel, golden["whisper.mel"], **TOL)


def test_mel_filters_are_slaney():
    filters = MelSettings().filters()
    assert filters.shape == (128, 201) and filters.dtype == torch.float32
    # Slaney normalisation: each triangle has unit area in Hz / 2 -> peaks shrink with bandwidth.
    peaks = filters.max(dim=1).values
    assert torch.all(peaks[:10] > peaks[-10:])
    assert torch.all(filters >= 0) and torch.all(filters.sum(dim=1) > 0)


def test_split_segments_follows_official_cut():
    pcm = np.arange(70, dtype=np.float32)
    assert [len(s) for s in split_segments(pcm, 30)] == [30, 30, 10]
    assert [len(s) for s in split_segments(pcm[:60], 30)] == [30, 30]
    assert split_segments(pcm[:0], 30) == []


def test_encoder_out_and_features_match_official(encoder, golden):
    wav = golden["wav16k"][0].numpy()
    features = encoder.features(wav)
    expected = golden["whisper.features"][0]
    assert features.shape == expected.shape == (47, 128)
    torch.testing.assert_close(features, expected, **TOL)
    # The stacking is row-major: frame 4t+j -> dims [j*d, (j+1)*d).
    torch.testing.assert_close(features.reshape(-1, 32), golden["whisper.encoder_out"][0], **TOL)


def test_token_len_rule(encoder):
    # token_len = (L - 1) // 1280 + 1: 1280 samples -> 1 row, 1281 -> 2 rows.
    rng = np.random.default_rng(3)
    assert encoder.features(rng.standard_normal(1280).astype(np.float32) * 0.1).shape == (1, 128)
    assert encoder.features(rng.standard_normal(1281).astype(np.float32) * 0.1).shape == (2, 128)


def test_batch_equals_single_and_long_input_is_segmented(encoder, golden):
    rng = np.random.default_rng(7)
    short = golden["wav16k"][0].numpy()[:20000]
    long = (0.2 * rng.standard_normal(16000 * 31 + 500)).astype(np.float32)  # 2 segments
    batch = encoder.features_batch([short, long])
    singles = [encoder.features(short), encoder.features(long)]
    # 31 s + 500 samples: segment 1 gives 375 rows, segment 2 (16500 samples) 13 rows.
    assert batch[1].shape == (375 + 13, 128)
    assert batch[0].shape == ((20000 - 1) // 1280 + 1, 128)
    for got, want in zip(batch, singles):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # The second segment is encoded on its own (starts again at position 0).
    tail = encoder.features(long[16000 * 30 :])
    torch.testing.assert_close(batch[1][375:], tail, atol=1e-5, rtol=1e-5)
