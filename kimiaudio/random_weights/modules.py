"""A StackShape's parts as modules in memory, with no weight files: what the benches run.

Each part is built from the config file a random checkpoint of that shape holds
(config_files.py), parsed by its loader's own parser, and takes as its parameters the seeded
tensors that checkpoint's weight file would hold (the generators of encoders.py, lm.py,
speech_output.py), drawn where the part runs: the module is made on the "meta" device and adopts them,
so the weights exist once, on the target device. For shapes.DEMO on the CPU in float32 the
parts equal the demo checkpoint's files loaded by the real loaders.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from itertools import chain
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from kimiaudio.audio.glm4_tokenizer import Glm4SpeechTokenizer
from kimiaudio.audio.log_mel import MelSettings
from kimiaudio.audio.whisper_features import WhisperFeatureEncoder
from kimiaudio.audio.whisper_vq_encoder import WhisperVQConfig
from kimiaudio.checkpoint.files import read_json
from kimiaudio.errors import KimiAudioError
from kimiaudio.models.bigvgan import BigVGAN, VocoderConfig
from kimiaudio.models.dit import DiTPrefix
from kimiaudio.models.dit_config import DiTConfig
from kimiaudio.models.kimia_config import KimiaConfig
from kimiaudio.models.kimia_lm import KimiAudioLM, assemble_lm
from kimiaudio.random_weights import encoders, lm, speech_output
from kimiaudio.random_weights.config_files import DETOKENIZER_DIR, GLM_DIR, VOCODER_DIR, WHISPER_DIR, write_config_files
from kimiaudio.random_weights.shapes import StackShape


def random_lm(
    config: dict, device: torch.device | str, dtype: torch.dtype, seed: int = 0, weights: str = "bf16"
) -> KimiAudioLM:
    """The LM that config.json `config` describes, with lm.lm_tensors' weights drawn on `device`
    layer by layer and finished as load_lm finishes a checkpoint's (fused; quantized as `weights`)."""
    return assemble_lm(
        KimiaConfig.from_dict(config, "random-weights config.json"),
        lm.iter_lm_tensors(seed, config, device, dtype),
        device,
        dtype,
        weights,
        "random LM",
    )


class RandomParts:
    """The parts of `shape` on `device` (in `dtype`; the GLM encoder in float32, as official).
    The configs are parsed once here; each part is built (and its weights drawn) when asked for."""

    def __init__(self, shape: StackShape, device: torch.device | str, dtype: torch.dtype, seed: int = 0):
        self.shape, self.device, self.dtype, self.seed = shape, torch.device(device), dtype, seed
        with tempfile.TemporaryDirectory(prefix="kimiaudio-random-configs-") as tmp:
            root = Path(tmp)
            write_config_files(root, shape)
            self.lm_config = read_json(root / "config.json")
            self.whisper_config = read_json(root / WHISPER_DIR / "config.json")
            self.whisper_mel = MelSettings.from_preprocessor_config(
                root / WHISPER_DIR / "preprocessor_config.json", int(self.whisper_config["num_mel_bins"])
            )
            self.glm_config = WhisperVQConfig.from_file(root / GLM_DIR / "config.json")
            self.glm_mel = MelSettings.from_preprocessor_config(
                root / GLM_DIR / "preprocessor_config.json", self.glm_config.num_mel_bins
            )
            self.dit_config = DiTConfig.from_yaml(root / DETOKENIZER_DIR / "config.yaml")
            self.vocoder_config = VocoderConfig.from_json(root / VOCODER_DIR / "config.json")

    def lm(self, weights: str = "bf16") -> KimiAudioLM:
        return random_lm(self.lm_config, self.device, self.dtype, self.seed, weights)

    def whisper(self) -> WhisperFeatureEncoder:
        from transformers import WhisperConfig

        config = WhisperConfig(**self.whisper_config)
        tensors = encoders.whisper_tensors(self.seed, self.whisper_config, self.device, self.dtype)
        # The encoder's tensors without their prefix, as WhisperFeatureEncoder.load keeps them
        # (the decoder stub is dropped here).
        state = {name.removeprefix("encoder."): t for name, t in tensors.items() if name.startswith("encoder.")}
        del tensors
        encoder = _adopt(
            lambda: WhisperFeatureEncoder.empty_encoder(config, "meta", self.dtype), state, "Whisper encoder"
        )
        return WhisperFeatureEncoder(encoder, self.whisper_mel, self.device, self.dtype)

    def glm4(self) -> Glm4SpeechTokenizer:
        tensors = encoders.glm_tensors(self.seed, self.shape, self.device)
        # The quantizer's EMA statistics are training state: Glm4SpeechTokenizer.load drops them too.
        state = {name: t for name, t in tensors.items() if not name.startswith("ema_")}
        model = _adopt(lambda: Glm4SpeechTokenizer.empty_model(self.glm_config, "meta"), state, "GLM-4-Voice tokenizer")
        return Glm4SpeechTokenizer(model, self.glm_mel, self.device)

    def dit(self) -> DiTPrefix:
        tensors = speech_output.dit_tensors(self.seed, self.shape, self.device, self.dtype)
        state = {name.replace("speech_model.", ""): t for name, t in tensors.items()}  # as load_dit reads them
        return _adopt(lambda: DiTPrefix(self.dit_config), state, "DiT")

    def vocoder(self) -> BigVGAN:
        tensors = speech_output.vocoder_tensors(self.seed, self.shape, self.device, self.dtype)
        return _adopt(lambda: BigVGAN(self.vocoder_config), tensors, "vocoder").fold_weight_norm()


M = TypeVar("M", bound=nn.Module)


def _adopt(build: Callable[[], M], state: dict[str, torch.Tensor], part: str) -> M:
    """`build()` on the meta device, its parameters and buffers then `state`'s tensors (no copy).
    The names and shapes must match exactly, and nothing may be left on the meta device."""
    with torch.device("meta"):
        module = build()
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise KimiAudioError(f"random {part}: the generated tensors do not fit the module ({exc})") from None
    empty = [name for name, t in chain(module.named_parameters(), module.named_buffers()) if t.is_meta]
    if empty and any(t.device.type != "meta" for t in state.values()):
        raise KimiAudioError(f"random {part}: {empty[0]!r} has no generated value ({len(empty)} in all)")
    return module.eval().requires_grad_(False)
