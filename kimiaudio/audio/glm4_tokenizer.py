"""GLM-4-Voice speech tokenizer: 16 kHz audio -> discrete 12.5 Hz speech codes.

Follows the official `Glm4Tokenizer.tokenize` / `extract_speech_token` (THUDM/GLM-4-Voice
speech_tokenizer/utils.py, as called by Kimi-Audio): cut the utterance into 30 s segments and
extract all of them as one transformers WhisperFeatureExtractor batch with padding="longest",
pad_to_multiple_of = conv strides * pooling * hop (1280 samples) and the attention mask taken
every hop; run the WhisperVQEncoder in float32; keep the codes whose mask is set
(ceil(L / 1280) per segment). The log-mel is our own (kimiaudio.audio.log_mel, the same math as
the extractor's torch path).

Batching several utterances: the official code would pad every segment to the longest one of
the batch, which changes the edge frames (STFT reflect padding and per-waveform max). Here each
utterance's mels are computed exactly as in a single-utterance call, then padded at the frame
level with masked zeros, so `tokenize_batch` returns what one-by-one `tokenize` returns.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from kimiaudio.audio.device_result import DeviceResult, compute_now, to_device
from kimiaudio.audio.log_mel import MelSettings, log_mel_spectrogram, padded_waveforms, split_segments
from kimiaudio.audio.staged_work import Stages
from kimiaudio.audio.whisper_vq_encoder import WhisperVQConfig, WhisperVQEncoder
from kimiaudio.checkpoint.files import load_into, load_safetensors
from kimiaudio.checkpoint.paths import CheckpointPaths
from kimiaudio.errors import AudioInputError


class Glm4SpeechTokenizer:
    """Owns the WhisperVQEncoder (float32, as official) and its mel front end."""

    # max_batch_segments: 8 windows of 30 s keep a GPU busy; in float32 with its [B, 1, T, T]
    # mask, 16 of them peaked at 1.42 GB on an H200, activations the memory plan reserves.
    def __init__(self, model: WhisperVQEncoder, mel: MelSettings, device: torch.device, max_batch_segments: int = 8):
        self.model = model
        self.mel = mel
        self.filters = mel.filters().to(device)  # [n_mels, n_fft // 2 + 1]
        self.device = device
        self.max_batch_segments = max_batch_segments
        # Samples per code: 160 (hop) * 2 (conv strides) * 4 (pooling) = 1280 at 16 kHz.
        self.samples_per_token = mel.hop_length * model.frame_stride * model.config.pool

    @classmethod
    def load(cls, paths: CheckpointPaths, device: str | torch.device = "cpu") -> Glm4SpeechTokenizer:
        directory = paths.glm_tokenizer
        config = WhisperVQConfig.from_file(directory / "config.json")
        mel = MelSettings.from_preprocessor_config(directory / "preprocessor_config.json", config.num_mel_bins)
        model = cls.empty_model(config, device)
        state = _encoder_state(load_safetensors(directory, dtype=torch.float32), config)
        load_into(model, state, directory / "model.safetensors")
        model.eval()
        return cls(model, mel, torch.device(device))

    @staticmethod
    def empty_model(config: WhisperVQConfig, device: str | torch.device) -> WhisperVQEncoder:
        """The float32 WhisperVQEncoder allocated once on `device`, values unset (load or fill them)."""
        with torch.device("meta"):  # skip random init
            model = WhisperVQEncoder(config)
        return model.to_empty(device=device)

    def tokenize(self, pcm16k: np.ndarray) -> list[int]:
        """Speech codes (0 .. quantize_vocab_size-1, no LM offset) of one utterance."""
        return self.tokenize_batch([pcm16k])[0]

    def tokenize_batch(self, pcms: list[np.ndarray]) -> list[list[int]]:
        """Codes of several utterances; equal to calling `tokenize` on each."""
        return compute_now(self.tokenize_batch_stages(pcms))

    @torch.inference_mode()
    def tokenize_batch_stages(self, pcms: list[np.ndarray]) -> Stages[DeviceResult[list[list[int]]]]:
        """`tokenize_batch` in stages (audio/staged_work.py): the log-mels, then each encoder
        layer; the codes and their masks stay on the device until the result is copied
        (audio/device_result.py)."""
        mels: list[torch.Tensor] = []  # [n_mels, T_u] per segment
        lengths: list[int] = []  # samples per segment
        owners: list[int] = []
        for index, pcm in enumerate(pcms):
            pcm = np.asarray(pcm, dtype=np.float32)
            if pcm.ndim != 1 or pcm.size == 0:
                raise AudioInputError(f"speech tokenizer: expected non-empty mono audio, got shape {pcm.shape}")
            segments = split_segments(pcm, self.mel.segment_samples)
            mels += list(self._utterance_mels(segments))
            lengths += [len(segment) for segment in segments]
            owners += [index] * len(segments)
        outputs: list[torch.Tensor] = []  # per encoder batch: its codes [S, T] and their mask [S, T]
        for start in range(0, len(mels), self.max_batch_segments):
            stop = start + self.max_batch_segments
            yield
            outputs += yield from self._encode(mels[start:stop], lengths[start:stop])

        def finish(host: list[torch.Tensor]) -> list[list[int]]:
            codes: list[list[int]] = [[] for _ in pcms]
            batches = zip(host[::2], host[1::2])  # (codes, mask) of each encoder batch
            rows = (row[keep].tolist() for tokens, mask in batches for row, keep in zip(tokens, mask))
            for owner, segment_codes in zip(owners, rows):
                codes[owner].extend(segment_codes)
            return codes

        return DeviceResult(outputs, finish)

    def _utterance_mels(self, segments: list[np.ndarray]) -> torch.Tensor:
        """Log-mel of one utterance's segments as the official single call pads them: [S, n_mels, T_u]."""
        longest = max(len(segment) for segment in segments)
        padded_len = -(-longest // self.samples_per_token) * self.samples_per_token  # "longest", multiple of 1280
        return log_mel_spectrogram(padded_waveforms(segments, padded_len, self.device), self.filters, self.mel)

    def _encode(self, mels: list[torch.Tensor], lengths: list[int]) -> Stages[list[torch.Tensor]]:
        """Run one encoder batch over segments padded (masked) to the longest mel: its codes
        [S, T_tok] and which of them are real [S, T_tok], on the device."""
        num_frames = max(mel.shape[-1] for mel in mels)
        batch = torch.stack([F.pad(mel, (0, num_frames - mel.shape[-1])) for mel in mels])  # [S, n_mels, T]
        # A mel frame is real if its first sample is (the extractor's sample mask taken every hop).
        valid = torch.tensor([-(-n // self.mel.hop_length) for n in lengths])
        mel_mask = to_device(torch.arange(num_frames)[None, :] < valid[:, None], self.device)  # [S, T]
        tokens, _, token_mask = yield from self.model.forward_stages(batch, mel_mask)
        return [tokens, token_mask]


def _encoder_state(state: dict[str, torch.Tensor], config: WhisperVQConfig) -> dict[str, torch.Tensor]:
    """The tensors the quantizing encoder uses, as `load_quantize_encoder` selects them.

    Accepts both unprefixed names and a full WhisperVQ model's `model.encoder.*`; drops the
    EMA statistics, the final LayerNorm and layers at or after quantize_position.
    """
    prefix = "model.encoder."
    if any(name.startswith(prefix) for name in state):
        state = {name[len(prefix) :]: tensor for name, tensor in state.items() if name.startswith(prefix)}
    kept = {}
    for name, tensor in state.items():
        if name.startswith(("ema_", "layer_norm.")):
            continue
        if name.startswith("layers.") and int(name.split(".")[1]) >= config.quantize_position:
            continue
        kept[name] = tensor
    return kept


def load_glm4_tokenizer(paths: CheckpointPaths, device: str | torch.device = "cpu") -> Glm4SpeechTokenizer:
    """The interface name of the brief: `Glm4SpeechTokenizer.load`."""
    return Glm4SpeechTokenizer.load(paths, device)
