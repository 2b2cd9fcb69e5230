"""Whisper log-mel spectrogram shared by both speech encoders.

Follows the official `log_mel_spectrogram` of Kimi-Audio's whisper_Lv3/whisper.py and the
torch path of transformers' `WhisperFeatureExtractor` (used by GLM-4-Voice), which are the
same computation: STFT with a periodic Hann window (center, reflect), power spectrum without
the last frame, Slaney mel filters, log10 clamped at 1e-10, a floor 8 below the maximum of
each waveform, then (x + 4) / 4. The official Kimi file `mel_filters.npz` is librosa's Slaney
filter bank; transformers' `mel_filter_bank(norm="slaney", mel_scale="slaney")` gives the
same matrix (within 4e-9), so both paths use this one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kimiaudio.audio.device_result import to_device
from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.checkpoint.files import POSITIVE_INT, checked_value, read_json
from kimiaudio.errors import CheckpointError


@dataclass(frozen=True)
class MelSettings:
    """The front-end constants of a Whisper-style preprocessor_config.json."""

    sample_rate: int = SPEECH_INPUT_RATE
    n_fft: int = 400
    hop_length: int = 160
    num_mel_bins: int = 128
    chunk_seconds: int = 30  # the encoders see at most 30 s per segment

    @property
    def segment_samples(self) -> int:
        return self.chunk_seconds * self.sample_rate

    @classmethod
    def from_preprocessor_config(cls, path, num_mel_bins: int) -> MelSettings:
        """Read preprocessor_config.json if present; the official Whisper values otherwise."""
        if not path.is_file():
            return cls(num_mel_bins=num_mel_bins)
        cfg = read_json(path)

        def positive(key: str, default: int) -> int:
            return checked_value(cfg, key, path, int, POSITIVE_INT, default)

        feature_size = positive("feature_size", num_mel_bins)
        if feature_size != num_mel_bins:
            raise CheckpointError(
                f"{path}: feature_size {feature_size} differs from the model's num_mel_bins {num_mel_bins}"
            )
        return cls(
            sample_rate=positive("sampling_rate", cls.sample_rate),
            n_fft=positive("n_fft", cls.n_fft),
            hop_length=positive("hop_length", cls.hop_length),
            num_mel_bins=num_mel_bins,
            chunk_seconds=positive("chunk_length", cls.chunk_seconds),
        )

    def filters(self) -> torch.Tensor:
        """Slaney-normalised mel filter bank, float32 [num_mel_bins, n_fft // 2 + 1]."""
        return slaney_mel_filters(self.n_fft, self.num_mel_bins, self.sample_rate, 0.0, self.sample_rate / 2)


def slaney_mel_filters(n_fft: int, num_mels: int, sample_rate: int, fmin: float, fmax: float) -> torch.Tensor:
    """Slaney-scale, Slaney-normalised mel filters as librosa.filters.mel makes them (Whisper's
    features and the vocoder's mel both use them), float32 [num_mels, n_fft // 2 + 1]."""
    from transformers.audio_utils import mel_filter_bank

    bank = mel_filter_bank(
        num_frequency_bins=n_fft // 2 + 1,
        num_mel_filters=num_mels,
        min_frequency=fmin,
        max_frequency=fmax,
        sampling_rate=sample_rate,
        norm="slaney",
        mel_scale="slaney",
    )  # float64 [freq, mel]
    return torch.from_numpy(np.ascontiguousarray(bank.T)).to(torch.float32)


def split_segments(pcm: np.ndarray, segment_samples: int) -> list[np.ndarray]:
    """Official 30 s cut: pcm[k*seg : (k+1)*seg] while k*seg < len (so empty input gives [])."""
    return [pcm[start : start + segment_samples] for start in range(0, len(pcm), segment_samples)]


def padded_waveforms(segments: list[np.ndarray], length: int, device: torch.device) -> torch.Tensor:
    """float32 [S, length] on `device`: each segment zero-padded at its end (pad_or_trim without
    the trim: no segment may be longer). One host-to-device copy of the samples themselves
    (asynchronous on CUDA: audio/device_result.py); the padding is made on the device."""
    flat = to_device(torch.from_numpy(np.concatenate([np.asarray(s, dtype=np.float32) for s in segments])), device)
    waveforms = torch.zeros(len(segments), length, dtype=torch.float32, device=device)
    offset = 0
    for row, segment in enumerate(segments):
        waveforms[row, : len(segment)] = flat[offset : offset + len(segment)]
        offset += len(segment)
    return waveforms


def log_mel_spectrogram(waveforms: torch.Tensor, filters: torch.Tensor, settings: MelSettings) -> torch.Tensor:
    """Log-mel of float32 waveforms [B, N] -> [B, num_mel_bins, N // hop_length].

    The max-8 floor is taken per waveform over its whole (padded) length, as both official
    paths do; padding therefore belongs to the caller, who must pad like the official code.
    """
    window = torch.hann_window(settings.n_fft, device=waveforms.device)  # periodic
    stft = torch.stft(
        waveforms,
        settings.n_fft,
        settings.hop_length,
        window=window,
        center=True,
        pad_mode="reflect",
        return_complex=True,
    )  # [B, freq, N // hop + 1]
    power = stft[..., :-1].abs() ** 2
    mel = filters.to(waveforms.device) @ power  # [B, mel, frames]
    log_spec = torch.clamp(mel, min=1e-10).log10()
    peak = log_spec.amax(dim=(1, 2), keepdim=True)
    log_spec = torch.maximum(log_spec, peak - 8.0)
    return (log_spec + 4.0) / 4.0
