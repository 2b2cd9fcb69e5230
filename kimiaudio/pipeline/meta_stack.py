"""A stack's parts built on the "meta" device from a checkpoint's config files: shapes and
dtypes, no memory, quantized as chosen and the detokenizer bucketed as served, so the memory
plan (memory_plan.py) of a card is made before anything is loaded, by the function that plans
a loaded stack: `bench --memory-plan` and `weights = auto`.
"""

from __future__ import annotations

import inspect
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from kimiaudio.checkpoint.paths import CheckpointPaths
from kimiaudio.config import served_detok
from kimiaudio.pipeline.memory_plan import plan_memory


@dataclass
class _Part:
    """What the plan reads of a speech encoder: its module and how many 30 s windows it takes
    in one batch (the loaded encoder's default, read from its class)."""

    max_batch_segments: int
    encoder: torch.nn.Module | None = None
    model: torch.nn.Module | None = None


def _default_batch(cls) -> int:
    return inspect.signature(cls.__init__).parameters["max_batch_segments"].default


@dataclass
class MetaStack:
    lm: torch.nn.Module
    whisper: _Part
    glm4: _Part
    detokenizer: object | None


def meta_stack(
    paths: CheckpointPaths, dtype: torch.dtype, config, lm_weights: str, dit_weights: str | None
) -> MetaStack:
    """The parts `paths`' config files describe, on the meta device, as the loaders would leave
    them (projections fused; LM and DiT quantized as chosen; the GLM encoder in float32; the
    detokenizer's batch as served: `served_detok`). dit_weights None: text only."""

    from kimiaudio.audio.glm4_tokenizer import Glm4SpeechTokenizer
    from kimiaudio.audio.whisper_features import WhisperFeatureEncoder
    from kimiaudio.audio.whisper_vq_encoder import WhisperVQConfig
    from kimiaudio.models.kimia_config import KimiaConfig
    from kimiaudio.models.kimia_lm import KimiAudioLM
    from kimiaudio.models.quantize import quantize_dit, quantize_lm

    with torch.device("meta"):
        lm = KimiAudioLM(KimiaConfig.from_file(paths.lm_config)).to(dtype)
    lm = quantize_lm(lm.fuse_projections(), lm_weights)
    whisper = WhisperFeatureEncoder.empty_encoder(
        WhisperFeatureEncoder.read_config(paths.whisper / "config.json"), "meta", dtype
    )
    glm = Glm4SpeechTokenizer.empty_model(WhisperVQConfig.from_file(paths.glm_tokenizer / "config.json"), "meta")
    detok = None
    if dit_weights is not None:
        from kimiaudio.detok.detokenizer import Detokenizer
        from kimiaudio.models.bigvgan import BigVGAN, VocoderConfig
        from kimiaudio.models.dit import DiTPrefix
        from kimiaudio.models.dit_config import DiTConfig

        with torch.device("meta"):
            dit = DiTPrefix(DiTConfig.from_yaml(paths.detokenizer / "config.yaml")).to(dtype)
            vocoder = BigVGAN(VocoderConfig.from_json(paths.vocoder / "config.json")).to(dtype).fold_weight_norm()
        detok = Detokenizer(quantize_dit(dit, dit_weights), vocoder, served_detok(config))
    return MetaStack(
        lm,
        _Part(_default_batch(WhisperFeatureEncoder), encoder=whisper),
        _Part(_default_batch(Glm4SpeechTokenizer), model=glm),
        detok,
    )


def plan_for_shape(
    shape: str,
    config,
    lm_weights: str,
    dit_weights: str | None,
    card_bytes: int,
    positions: int,
    dtype: torch.dtype = torch.bfloat16,
) -> dict:
    """The plan of a random_weights shape (e.g. "full": the real model's shapes) on a GPU."""
    from kimiaudio.random_weights.config_files import GLM_DIR, write_config_files
    from kimiaudio.random_weights.shapes import shape_named

    with tempfile.TemporaryDirectory(prefix="kimiaudio-plan-") as tmp:
        root = Path(tmp)
        write_config_files(root, shape_named(shape))
        paths = CheckpointPaths(root=root, glm_tokenizer=root / GLM_DIR, text_only=dit_weights is None)
        stack = meta_stack(paths, dtype, config, lm_weights, dit_weights)
    return plan_memory(stack, config, card_bytes, on_gpu=True, positions=positions)
