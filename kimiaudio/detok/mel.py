"""The vocoder's log-mel of a 24 kHz waveform: what a voice prompt conditions the DiT on.

Follows the official BigVGANWrapper.extract_mel_from_wav -> vocoder/utils.get_melspec
(kimia_infer/models/detokenizer): reflect-pad (n_fft - hop_size) // 2 on both ends, torch.stft
with center=False and a Hann window of win_size, magnitude sqrt(re^2 + im^2 + 1e-9), the
librosa Slaney mel basis (fmin, fmax; fmax null = sr / 2), then log(clamp(x, 1e-5)).
Every constant comes from the checkpoint's vocoder/config.json. The mel basis is the one
audio/log_mel.py uses for Whisper (transformers' Slaney bank equals librosa's to ~4e-9).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
from torch import Tensor

from kimiaudio.audio.log_mel import slaney_mel_filters
from kimiaudio.checkpoint.files import config_value, read_json
from kimiaudio.errors import CheckpointError, KimiAudioError

LOG_FLOOR = 1e-5  # official dynamic_range_compression clip_val
MAGNITUDE_EPS = 1e-9  # official: inside the square root


@dataclass(frozen=True)
class VocoderMel:
    n_fft: int
    num_mels: int
    sampling_rate: int
    hop_size: int
    win_size: int
    fmin: float
    fmax: float | None  # None: half the sampling rate

    @classmethod
    def from_vocoder_config(cls, path: Path) -> VocoderMel:
        """The mel settings of a vocoder/config.json (the keys the official wrapper reads)."""
        raw = read_json(path)

        def number(key, kind, allow_none=False):
            value = config_value(raw, key, path)
            if value is None and allow_none:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise CheckpointError(f"{path}: {key!r} = {value!r}, expected a number >= 0")
            if kind is int and int(value) != value:
                raise CheckpointError(f"{path}: {key!r} = {value!r}, expected an integer")
            return kind(value)

        mel = cls(
            number("n_fft", int),
            number("num_mels", int),
            number("sampling_rate", int),
            number("hop_size", int),
            number("win_size", int),
            number("fmin", float),
            number("fmax", float, allow_none=True),
        )
        if min(mel.n_fft, mel.num_mels, mel.hop_size, mel.win_size) < 1 or mel.win_size > mel.n_fft:
            raise CheckpointError(
                f"{path}: n_fft, num_mels, hop_size, win_size must be positive with win_size <= n_fft"
            )
        return mel

    @cached_property
    def basis(self) -> Tensor:
        """Slaney mel filters, float32 [num_mels, n_fft // 2 + 1] (librosa.filters.mel)."""
        fmax = self.sampling_rate / 2 if self.fmax is None else self.fmax
        return slaney_mel_filters(self.n_fft, self.num_mels, self.sampling_rate, self.fmin, fmax)

    def frames(self, num_samples: int) -> int:
        """Mel frames of a waveform of this many samples."""
        padded = num_samples + 2 * ((self.n_fft - self.hop_size) // 2)
        return 0 if padded < self.n_fft else 1 + (padded - self.n_fft) // self.hop_size

    def __call__(self, wav: Tensor) -> Tensor:
        """float32 wav [samples] at sampling_rate -> log-mel [frames, num_mels] (CPU, fp32)."""
        wav = torch.as_tensor(wav, dtype=torch.float32).reshape(-1).cpu()
        pad = (self.n_fft - self.hop_size) // 2
        if wav.numel() <= pad or self.frames(wav.numel()) < 1:
            raise KimiAudioError(f"a voice prompt of {wav.numel()} samples is too short for one mel frame")
        padded = torch.nn.functional.pad(wav[None, None], (pad, pad), mode="reflect")[0]  # [1, samples + 2 pad]
        spec = torch.stft(
            padded,
            self.n_fft,
            hop_length=self.hop_size,
            win_length=self.win_size,
            window=torch.hann_window(self.win_size),
            center=False,
            normalized=False,
            onesided=True,
            return_complex=True,
        )  # [1, freq, frames]
        magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + MAGNITUDE_EPS)
        mel = torch.log(torch.clamp(self.basis @ magnitude, min=LOG_FLOOR))  # [1, num_mels, frames]
        return mel[0].transpose(0, 1).contiguous()
