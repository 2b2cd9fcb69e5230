"""Whisper log-mel and continuous features against the official goldens (tiny checkpoint)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kimiaudio.audio.log_mel import MelSettings, log_mel_spectrogram, split_segments
from kimiaudio.audio.whisper_features import FRAMES_PER_TOKEN, WhisperFeatureEncoder
from kimiaudio.checkpoint.files import read_json
from kimiaudio.checkpoint.paths import CheckpointPaths

TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def encoder(golden_checkpoint):
    root = golden_checkpoint
    return WhisperFeatureEncoder.load(CheckpointPaths(root, root / "glm-4-voice-tokenizer"), "cpu", torch.float32)


def test_mel_matches_official(golden, golden_checkpoint):
    directory = golden_checkpoint / "whisper-large-v3"
    num_mel_bins = read_json(directory / "config.json")["num_mel_bins"]
    settings = MelSettings.from_preprocessor_config(directory / "preprocessor_config.json", num_mel_bins)
    wav = golden["wav16k"][0]
    padded = torch.nn.functional.pad(wav, (0, settings.segment_samples - len(wav)))[None]  # pad_or_trim
    mel = log_mel_spectrogram(padded, settings.filters(), settings)[0]
    frames = settings.segment_samples // settings.hop_length
    assert mel.shape == golden["whisper.mel"].shape == (num_mel_bins, frames)
    torch.testing.assert_close(mel, golden["whisper.mel"], **TOL)


def test_mel_filters_are_slaney():
    settings = MelSettings()  # the official whisper-large-v3 front end
    filters = settings.filters()
    assert filters.shape == (settings.num_mel_bins, settings.n_fft // 2 + 1) and filters.dtype == torch.float32
    # Slaney normalisation: each triangle has unit area in Hz / 2 -> peaks shrink with bandwidth.
    peaks = filters.max(dim=1).values
    assert torch.all(peaks[:10] > peaks[-10:])
    assert torch.all(filters >= 0) and torch.all(filters.sum(dim=1) > 0)


def test_split_segments_follows_official_cut():
    pcm = np.arange(70, dtype=np.float32)
    assert [len(s) for s in split_segments(pcm, 30)] == [30, 30, 10]
    assert [len(s) for s in split_segments(pcm[:60], 30)] == [30, 30]
    assert split_segments(pcm[:0], 30) == []


def _width(encoder) -> int:
    """Feature width: stacked encoder frames (= the LM's kimia_adaptor_input_dim)."""
    return FRAMES_PER_TOKEN * encoder.encoder.config.d_model


def test_encoder_out_and_features_match_official(encoder, golden):
    wav = golden["wav16k"][0].numpy()
    features = encoder.features(wav)
    expected = golden["whisper.features"][0]
    assert features.shape == expected.shape == ((len(wav) - 1) // encoder.samples_per_token + 1, _width(encoder))
    torch.testing.assert_close(features, expected, **TOL)
    # The stacking is row-major: frame 4t+j -> dims [j*d, (j+1)*d).
    d_model = encoder.encoder.config.d_model
    torch.testing.assert_close(features.reshape(-1, d_model), golden["whisper.encoder_out"][0], **TOL)


def test_token_len_rule(encoder):
    # token_len = (L - 1) // samples_per_token + 1: one token's samples -> 1 row, one more -> 2 rows.
    rng = np.random.default_rng(3)
    n = encoder.samples_per_token
    assert encoder.features(rng.standard_normal(n).astype(np.float32) * 0.1).shape == (1, _width(encoder))
    assert encoder.features(rng.standard_normal(n + 1).astype(np.float32) * 0.1).shape == (2, _width(encoder))


def test_batch_equals_single_and_long_input_is_segmented(encoder, golden):
    rng = np.random.default_rng(7)
    segment, per_token = encoder.mel.segment_samples, encoder.samples_per_token
    wav = golden["wav16k"][0].numpy()
    short = wav[: len(wav) // 3]
    long = (0.2 * rng.standard_normal(segment + encoder.mel.sample_rate + 500)).astype(np.float32)  # 2 segments
    batch = encoder.features_batch([short, long])
    singles = [encoder.features(short), encoder.features(long)]
    # Each segment gives (its samples - 1) // per_token + 1 rows.
    first_rows = (segment - 1) // per_token + 1
    assert batch[1].shape == (first_rows + (len(long) - segment - 1) // per_token + 1, _width(encoder))
    assert batch[0].shape == ((len(short) - 1) // per_token + 1, _width(encoder))
    for got, want in zip(batch, singles):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # The second segment is encoded on its own (starts again at position 0).
    tail = encoder.features(long[segment:])
    torch.testing.assert_close(batch[1][first_rows:], tail, atol=1e-5, rtol=1e-5)


def test_speech_window_is_the_official_window_at_30_s_and_batch_invariant(encoder):
    """whisper_window = "speech" encodes each segment at its own length with the padding masked:
    a segment of exactly 30 s is the official window itself, and a segment's features do not
    depend on the others in its batch (lengths from under a token's worth to two segments)."""
    rng = np.random.default_rng(11)
    segment = encoder.mel.segment_samples
    whole = (0.1 * rng.standard_normal(segment)).astype(np.float32)
    torch.testing.assert_close(encoder.features(whole, exact=False), encoder.features(whole), atol=0, rtol=0)
    inputs = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (1000, 50_000, segment + 20_000)]
    batch = encoder.features_batch(inputs, exact=False)
    for pcm, got in zip(inputs, batch):
        assert got.shape == encoder.features(pcm).shape  # one row per token, as official
        torch.testing.assert_close(got, encoder.features(pcm, exact=False), atol=1e-5, rtol=1e-5)


def test_speech_window_is_not_the_official_features(encoder, golden):
    """Why it is off by default: the official encoder attends over the window's padding, so a
    short utterance's features differ without it (README, "Speech encoders", gives the size of
    the difference on this checkpoint)."""
    wav = golden["wav16k"][0].numpy()
    official, speech = golden["whisper.features"][0], encoder.features(wav, exact=False)
    assert speech.shape == official.shape
    rms = ((speech - official).pow(2).mean() / official.pow(2).mean()).sqrt()
    assert rms > 0.01
