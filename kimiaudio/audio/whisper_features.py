"""Continuous Whisper-large-v3 features of Kimi-Audio (the input of the LM's VQ adaptor).

Follows the official `WhisperEncoder.tokenize_waveform` (kimia_infer whisper_Lv3/whisper.py)
and `KimiAPromptManager.extract_whisper_feat`: cut 16 kHz audio into 30 s segments; for each,
token_len = (L - 1) // 1280 + 1, zero-pad to 30 s, log-mel in float32 (here on the model's
device, where the official code uses the CPU: the same computation), cast to the model dtype,
run transformers' WhisperEncoder over all 3000 frames (the padding included, as the official
code does), keep the first token_len * 4 frames (50 Hz); concatenate the segments and stack 4
frames per row: [4T, d_model] -> [T, 4 * d_model] (12.5 Hz, one row per token).
Not official, on request (`exact=False`, [audio] whisper_window = "speech"): each segment
encoded at its own length, about 30 s / its length times less work, at some error.
The encoder is built from whisper-large-v3/config.json and loaded with the `encoder.*` tensors
of its model.safetensors (the decoder is not used).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from kimiaudio.audio.device_result import DeviceResult, compute_now, to_device
from kimiaudio.audio.log_mel import MelSettings, log_mel_spectrogram, padded_waveforms, split_segments
from kimiaudio.audio.staged_work import Stages
from kimiaudio.checkpoint.files import POSITIVE_INT, checked_value, load_into, load_safetensors, read_json
from kimiaudio.checkpoint.paths import CheckpointPaths
from kimiaudio.errors import AudioInputError, CheckpointError
from kimiaudio.validation import NO_BOUNDS, Bounds

# Official constant: 4 encoder frames (50 Hz) are stacked into one 12.5 Hz feature row.
FRAMES_PER_TOKEN = 4


class WhisperFeatureEncoder:
    """Owns the Whisper encoder and its mel front end; turns 16 kHz audio into LM features."""

    # max_batch_segments: 8 windows of 30 s (12,000 positions) keep a GPU busy; more would only
    # grow the activations the memory plan reserves beside the KV pool.
    def __init__(
        self, encoder, mel: MelSettings, device: torch.device, dtype: torch.dtype, max_batch_segments: int = 8
    ):
        self.encoder = encoder
        self.mel = mel
        self.filters = mel.filters().to(device)  # [n_mels, n_fft // 2 + 1]
        self.device = device
        self.dtype = dtype
        self.max_batch_segments = max_batch_segments
        # conv2 has stride 2: one encoder frame per 2 mel hops; 4 frames per token.
        strides = encoder.conv1.stride[0] * encoder.conv2.stride[0]
        self.samples_per_token = mel.hop_length * strides * FRAMES_PER_TOKEN  # 1280 at 16 kHz

    @classmethod
    def load(cls, paths: CheckpointPaths, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        directory = paths.whisper
        config = cls.read_config(directory / "config.json")
        mel = MelSettings.from_preprocessor_config(directory / "preprocessor_config.json", int(config.num_mel_bins))
        if mel.segment_samples != config.max_source_positions * 2 * mel.hop_length:
            # The encoder only accepts exactly max_source_positions * 2 mel frames.
            raise CheckpointError(f"{directory}: chunk_length and hop_length do not match max_source_positions")
        encoder = cls.empty_encoder(config, device, dtype)
        state = _encoder_state(load_safetensors(directory, keep=_PREFIXES, dtype=dtype), directory)
        load_into(encoder, state, directory / "model.safetensors")
        encoder.eval()
        return cls(encoder, mel, torch.device(device), dtype)

    @staticmethod
    def read_config(path: Path):
        """transformers' WhisperConfig of a whisper-large-v3/config.json, the keys the encoder
        is built from checked first: transformers takes any value and fails later, deep in
        building the encoder, without naming the file. A key left out keeps transformers'
        default, as the official code builds it."""
        from transformers import WhisperConfig
        from transformers.activations import ACT2FN

        raw = read_json(path)
        checks: dict[str, tuple[type, Bounds]] = {key: (int, POSITIVE_INT) for key in _SIZES}
        checks.update(activation_function=(str, Bounds(choices=tuple(ACT2FN))), scale_embedding=(bool, NO_BOUNDS))
        for key, (expected, bounds) in checks.items():
            if key in raw:
                checked_value(raw, key, path, expected, bounds)
        try:
            config = WhisperConfig(**raw)
        except (TypeError, ValueError, AttributeError) as exc:  # a key transformers itself refuses
            first = next(iter(str(exc).splitlines()), "")
            raise CheckpointError(f"{path}: not a Whisper config ({type(exc).__name__}: {first})") from None
        if config.d_model % config.encoder_attention_heads:
            raise CheckpointError(
                f"{path}: d_model {config.d_model} is not a multiple of "
                f"encoder_attention_heads {config.encoder_attention_heads}"
            )
        return config

    @staticmethod
    def empty_encoder(config, device: str | torch.device, dtype: torch.dtype):
        """transformers' WhisperEncoder for a WhisperConfig, allocated once on `device` in
        `dtype` with its values unset (no random init of ~640M parameters): load or fill them."""
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        config._attn_implementation = "sdpa"
        with torch.device("meta"):
            encoder = WhisperEncoder(config)
        return torch.nn.Module.to(encoder, dtype).to_empty(device=device)  # (transformers' `to` adds only checks)

    def features(self, pcm16k: np.ndarray, exact: bool = True) -> torch.Tensor:
        """Features of one utterance: [T, 4 * d_model] in the model dtype, on the host."""
        return self.features_batch([pcm16k], exact)[0]

    def features_batch(self, pcms: list[np.ndarray], exact: bool = True) -> list[torch.Tensor]:
        """Features of several utterances; all their 30 s segments go through one encoder batch."""
        return compute_now(self.features_batch_stages(pcms, exact))

    @torch.inference_mode()
    def features_batch_stages(self, pcms: list[np.ndarray], exact: bool = True) -> Stages[DeviceResult[list]]:
        """`features_batch` in stages (audio/staged_work.py): the log-mel, then each layer; the
        kept frames stay on the device until the result is copied (audio/device_result.py).

        `exact`: every segment fills the official 30 s window (the default). False: each is
        encoded at its own length (whole tokens), its padding masked, faster and not the
        official features (README, "Speech encoders")."""
        segments: list[np.ndarray] = []
        owners: list[int] = []
        for index, pcm in enumerate(pcms):
            pcm = np.asarray(pcm, dtype=np.float32)
            if pcm.ndim != 1 or pcm.size == 0:
                raise AudioInputError(f"whisper features: expected non-empty mono audio, got shape {pcm.shape}")
            for segment in split_segments(pcm, self.mel.segment_samples):
                segments.append(segment)
                owners.append(index)
        encode = self._encode_window if exact else self._encode_speech
        packed: list[torch.Tensor] = []  # per encoder batch: the kept frames of its segments, [frames, d_model]
        for start in range(0, len(segments), self.max_batch_segments):
            packed.append((yield from encode(segments[start : start + self.max_batch_segments])))
        kept = [self._token_len(segment) * FRAMES_PER_TOKEN for segment in segments]

        def finish(host: list[torch.Tensor]) -> list[torch.Tensor]:
            frames = torch.cat(host).split(kept)  # per segment, [4T_s, d]
            results = []
            for index in range(len(pcms)):
                stacked = torch.cat([f for f, owner in zip(frames, owners) if owner == index])  # [4T, d]
                results.append(stacked.reshape(-1, FRAMES_PER_TOKEN * stacked.shape[-1]))  # [T, 4d], row-major
            return results

        return DeviceResult(packed, finish)

    def _token_len(self, segment: np.ndarray) -> int:
        return (len(segment) - 1) // self.samples_per_token + 1

    def _encode_window(self, segments: list[np.ndarray]) -> Stages[torch.Tensor]:
        """The official way: each segment zero-padded to the 30 s window (pad_or_trim) and encoded
        whole, the padding included. The frames kept, segment after segment: [sum 4T_s, d_model]."""
        waveforms = padded_waveforms(segments, self.mel.segment_samples, self.device)  # [S, 480000] fp32
        mel = log_mel_spectrogram(waveforms, self.filters, self.mel).to(self.dtype)  # [S, n_mels, 3000]
        yield
        hidden = yield from self._encoder_stages(mel)  # [S, 1500, d_model]
        return torch.cat([hidden[row, : self._token_len(s) * FRAMES_PER_TOKEN] for row, s in enumerate(segments)])

    def _encode_speech(self, segments: list[np.ndarray]) -> Stages[torch.Tensor]:
        """The inexact way: each segment's log-mel over its own whole tokens of samples (as if it
        were alone), the batch padded to the longest with the padding masked out of the
        convolutions and the attention, so a segment's frames do not depend on its batch."""
        token_lens = [self._token_len(s) for s in segments]
        lengths = [n * self.samples_per_token for n in token_lens]
        waveforms = padded_waveforms(segments, max(lengths), self.device)
        mels = [
            log_mel_spectrogram(waveforms[row : row + 1, :length], self.filters, self.mel)[0]
            for row, length in enumerate(lengths)
        ]  # [n_mels, 8T_s] each
        num_frames = max(m.shape[-1] for m in mels)
        mel = torch.stack([F.pad(m, (0, num_frames - m.shape[-1])) for m in mels]).to(self.dtype)
        mel_frames = to_device(torch.tensor([m.shape[-1] for m in mels]), self.device)  # [S]
        yield
        hidden = yield from self._encoder_stages(mel, mel_frames)
        return torch.cat([hidden[row, : n * FRAMES_PER_TOKEN] for row, n in enumerate(token_lens)])

    def _encoder_stages(self, mel: torch.Tensor, mel_frames: torch.Tensor | None = None) -> Stages[torch.Tensor]:
        """transformers' WhisperEncoder.forward in eval mode (no dropout or layer drop, so every
        layer runs), through its own modules, pausing before each layer. `mel_frames` [S]: each
        row's real mel frames (None: every frame is real, the official window); past them the
        first convolution's output is zeroed (what the second one would see as its padding if
        the row were alone) and the keys are masked."""
        encoder = self.encoder
        x = F.gelu(encoder.conv1(mel))  # [S, d, T_mel]
        mask = None
        if mel_frames is not None:
            real = torch.arange(x.shape[-1], device=x.device)[None, :] < mel_frames[:, None]  # [S, T_mel]
            x = x * real[:, None, :].to(x.dtype)
            keys = real[:, :: encoder.conv2.stride[0]]  # [S, T]: encoder frames of real mel frames
            mask = torch.zeros(keys.shape, dtype=x.dtype, device=x.device).masked_fill(~keys, torch.finfo(x.dtype).min)
            mask = mask[:, None, None, :].expand(-1, 1, keys.shape[1], -1)  # additive [S, 1, T, T]
        x = F.gelu(encoder.conv2(x)).permute(0, 2, 1)  # [S, T, d]
        x = x + encoder.embed_positions.weight[: x.shape[1]]  # the official window: every position
        for layer in encoder.layers:
            yield
            x = layer(x, mask, layer_head_mask=None)[0]
        return encoder.layer_norm(x)


# The sizes transformers' WhisperEncoder is built from (and num_mel_bins, that of the log-mel).
_SIZES = (
    "d_model",
    "encoder_layers",
    "encoder_attention_heads",
    "encoder_ffn_dim",
    "num_mel_bins",
    "max_source_positions",
)

# WhisperModel checkpoints name the encoder `encoder.*`; WhisperForConditionalGeneration ones `model.encoder.*`.
_PREFIXES = ("encoder.", "model.encoder.")


def _encoder_state(state: dict[str, torch.Tensor], directory) -> dict[str, torch.Tensor]:
    for prefix in _PREFIXES:
        found = {name[len(prefix) :]: tensor for name, tensor in state.items() if name.startswith(prefix)}
        if found:
            return found
    raise CheckpointError(f"{directory / 'model.safetensors'}: no 'encoder.*' tensors (expected a Whisper checkpoint)")


def load_whisper_encoder(
    paths: CheckpointPaths, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
):
    """The interface name of the brief: `WhisperFeatureEncoder.load`."""
    return WhisperFeatureEncoder.load(paths, device, dtype)
