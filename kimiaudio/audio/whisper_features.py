"""Continuous Whisper-large-v3 features of Kimi-Audio (the input of the LM's VQ adaptor).

Follows the official `WhisperEncoder.tokenize_waveform` (kimia_infer whisper_Lv3/whisper.py)
and `KimiAPromptManager.extract_whisper_feat`: cut 16 kHz audio into 30 s segments; for each,
token_len = (L - 1) // 1280 + 1, zero-pad to 30 s, log-mel in float32 on the CPU, cast to the
model dtype, run transformers' WhisperEncoder over all 3000 frames (the padding included, as
the official code does), keep the first token_len * 4 frames (50 Hz); concatenate the segments
and stack 4 frames per row: [4T, d_model] -> [T, 4 * d_model] (12.5 Hz, one row per token).
The encoder is built from whisper-large-v3/config.json and loaded with the `encoder.*` tensors
of its model.safetensors (the decoder is not used).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from kimiaudio.audio.log_mel import MelSettings, log_mel_spectrogram, split_segments
from kimiaudio.audio.staged_work import Stages, run_to_end
from kimiaudio.checkpoint.files import load_into, load_safetensors, read_json
from kimiaudio.checkpoint.paths import CheckpointPaths
from kimiaudio.errors import AudioInputError, CheckpointError

# Official constant: 4 encoder frames (50 Hz) are stacked into one 12.5 Hz feature row.
FRAMES_PER_TOKEN = 4


class WhisperFeatureEncoder:
    """Owns the Whisper encoder and its mel front end; turns 16 kHz audio into LM features."""

    def __init__(
        self, encoder, mel: MelSettings, device: torch.device, dtype: torch.dtype, max_batch_segments: int = 16
    ):
        self.encoder = encoder
        self.mel = mel
        self.filters = mel.filters()  # [n_mels, n_fft // 2 + 1], used on the CPU
        self.device = device
        self.dtype = dtype
        self.max_batch_segments = max_batch_segments
        # conv2 has stride 2: one encoder frame per 2 mel hops; 4 frames per token.
        strides = encoder.conv1.stride[0] * encoder.conv2.stride[0]
        self.samples_per_token = mel.hop_length * strides * FRAMES_PER_TOKEN  # 1280 at 16 kHz

    @classmethod
    def load(cls, paths: CheckpointPaths, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import WhisperConfig

        directory = paths.whisper
        config = WhisperConfig(**read_json(directory / "config.json"))
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
    def empty_encoder(config, device: str | torch.device, dtype: torch.dtype):
        """transformers' WhisperEncoder for a WhisperConfig, allocated once on `device` in
        `dtype` with its values unset (no random init of ~640M parameters): load or fill them."""
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        config._attn_implementation = "sdpa"
        with torch.device("meta"):
            encoder = WhisperEncoder(config)
        return torch.nn.Module.to(encoder, dtype).to_empty(device=device)  # (transformers' `to` adds only checks)

    def features(self, pcm16k: np.ndarray) -> torch.Tensor:
        """Features of one utterance: [T, 4 * d_model] in the model dtype, on the model device."""
        return self.features_batch([pcm16k])[0]

    def features_batch(self, pcms: list[np.ndarray]) -> list[torch.Tensor]:
        """Features of several utterances; all their 30 s segments go through one encoder batch."""
        return run_to_end(self.features_batch_stages(pcms))

    @torch.inference_mode()
    def features_batch_stages(self, pcms: list[np.ndarray]) -> Stages[list[torch.Tensor]]:
        """`features_batch` in stages (audio/staged_work.py): the log-mel, the convolutions, each layer."""
        segments: list[np.ndarray] = []
        owners: list[int] = []
        for index, pcm in enumerate(pcms):
            pcm = np.asarray(pcm, dtype=np.float32)
            if pcm.ndim != 1 or pcm.size == 0:
                raise AudioInputError(f"whisper features: expected non-empty mono audio, got shape {pcm.shape}")
            for segment in split_segments(pcm, self.mel.segment_samples):
                segments.append(segment)
                owners.append(index)
        per_segment: list[torch.Tensor] = []
        for start in range(0, len(segments), self.max_batch_segments):
            per_segment += yield from self._encode(segments[start : start + self.max_batch_segments])
        results = []
        for index in range(len(pcms)):
            stacked = torch.cat([per_segment[i] for i, owner in enumerate(owners) if owner == index])  # [4T, d]
            results.append(stacked.reshape(-1, FRAMES_PER_TOKEN * stacked.shape[-1]))  # [T, 4d], row-major
        return results

    def _encode(self, segments: list[np.ndarray]) -> Stages[list[torch.Tensor]]:
        """Encoder frames kept for each segment: [token_len * 4, d_model] each."""
        padded = np.zeros((len(segments), self.mel.segment_samples), dtype=np.float32)  # pad_or_trim
        for row, segment in enumerate(segments):
            padded[row, : len(segment)] = segment
        mel = log_mel_spectrogram(torch.from_numpy(padded), self.filters, self.mel)  # [S, n_mels, 3000] fp32 CPU
        mel = mel.to(device=self.device, dtype=self.dtype)
        yield
        hidden = yield from self._encoder_stages(mel)  # [S, 1500, d_model]
        token_lens = [(len(segment) - 1) // self.samples_per_token + 1 for segment in segments]
        return [hidden[row, : n * FRAMES_PER_TOKEN] for row, n in enumerate(token_lens)]

    def _encoder_stages(self, mel: torch.Tensor) -> Stages[torch.Tensor]:
        """transformers' WhisperEncoder.forward in eval mode (no dropout or layer drop, so every
        layer runs), through its own modules, pausing after each layer."""
        encoder = self.encoder
        x = F.gelu(encoder.conv1(mel))
        x = F.gelu(encoder.conv2(x)).permute(0, 2, 1)
        x = x + encoder.embed_positions.weight  # every position: the 30 s window is always whole
        for layer in encoder.layers:
            yield
            x = layer(x, None, layer_head_mask=None)[0]
        return encoder.layer_norm(x)


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
