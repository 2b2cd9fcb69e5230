"""The audio encoders' configs and seeded tensors for a StackShape (shapes.py).

whisper-large-v3/ (a transformers WhisperModel) and glm-4-voice-tokenizer/ (GLM-4-Voice's
WhisperVQEncoder, quantizer layers only): the official config keys and tensor names, the
shape's sizes; whisper's sinusoid positions are computed as the official code computes them.
The speech output's parts (DiT, BigVGAN) are in speech_output.py, the LM in lm.py.
"""

from __future__ import annotations

import math

import torch

from kimiaudio.random_weights.seeded_init import SeededInit
from kimiaudio.random_weights.shapes import StackShape, WhisperShape

# The Whisper decoder is never run (only the encoder's features are used), so every shape
# writes the same stub of it: the official layout, at the smallest sizes.
DECODER_STUB = dict(layers=1, max_target=16, vocab=64)
MAX_SOURCE_POSITIONS = 1500  # whisper 30 s at 50 Hz
NUM_MELS = 80


# ---- whisper-large-v3 and glm-4-voice-tokenizer (both Whisper encoders) ----------------------


def whisper_config(shape: StackShape) -> dict:
    """The config.json keys transformers 4.51 writes for a WhisperModel, in sorted order."""
    return _whisper_keys(shape.whisper)


def _whisper_keys(sizes: WhisperShape) -> dict:
    d_model, encoder_layers, heads, ffn = sizes.d_model, sizes.layers, sizes.heads, sizes.ffn
    return {
        "activation_dropout": 0.0,
        "activation_function": "gelu",
        "apply_spec_augment": False,
        "architectures": ["WhisperModel"],
        "attention_dropout": 0.0,
        "begin_suppress_tokens": None,
        "bos_token_id": DECODER_STUB["vocab"] - 2,
        "classifier_proj_size": 256,
        "d_model": d_model,
        "decoder_attention_heads": heads,
        "decoder_ffn_dim": ffn,
        "decoder_layerdrop": 0.0,
        "decoder_layers": DECODER_STUB["layers"],
        "decoder_start_token_id": DECODER_STUB["vocab"] - 3,
        "dropout": 0.0,
        "encoder_attention_heads": heads,
        "encoder_ffn_dim": ffn,
        "encoder_layerdrop": 0.0,
        "encoder_layers": encoder_layers,
        "eos_token_id": DECODER_STUB["vocab"] - 2,
        "init_std": 0.02,
        "is_encoder_decoder": True,
        "mask_feature_length": 10,
        "mask_feature_min_masks": 0,
        "mask_feature_prob": 0.0,
        "mask_time_length": 10,
        "mask_time_min_masks": 2,
        "mask_time_prob": 0.05,
        "max_source_positions": MAX_SOURCE_POSITIONS,
        "max_target_positions": DECODER_STUB["max_target"],
        "median_filter_width": 7,
        "model_type": "whisper",
        "num_hidden_layers": encoder_layers,
        "num_mel_bins": 128,
        "pad_token_id": DECODER_STUB["vocab"] - 1,
        "scale_embedding": False,
        "torch_dtype": "float32",
        "transformers_version": "4.51.3",
        "use_cache": True,
        "use_weighted_layer_sum": False,
        "vocab_size": DECODER_STUB["vocab"],
    }


def preprocessor_config() -> dict:
    """Whisper-large-v3's feature extractor: 128 mel bins, 25 ms window, 10 ms hop, 30 s."""
    return {
        "chunk_length": 30,
        "dither": 0.0,
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": 128,
        "hop_length": 160,
        "n_fft": 400,
        "n_samples": 480000,
        "nb_max_frames": 3000,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": False,
        "sampling_rate": 16000,
    }


def _sinusoids(length: int, channels: int) -> torch.Tensor:
    """Whisper's fixed position table [length, channels]: sin half, then cos half."""
    increment = math.log(10000) / (channels // 2 - 1)
    inv = torch.exp(-increment * torch.arange(channels // 2, dtype=torch.float64))
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1).float()


def _encoder_layer_tensors(init: SeededInit, prefix: str, d: int, ffn: int) -> dict[str, torch.Tensor]:
    t = {}
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        t[f"{prefix}self_attn.{name}.weight"] = init.weight(d, d)
        if name != "k_proj":  # whisper's k_proj has no bias
            t[f"{prefix}self_attn.{name}.bias"] = init.bias(d)
    for norm in ("self_attn_layer_norm", "final_layer_norm"):
        t[f"{prefix}{norm}.weight"] = init.ones(d)
        t[f"{prefix}{norm}.bias"] = init.zeros(d)
    t[f"{prefix}fc1.weight"] = init.weight(ffn, d)
    t[f"{prefix}fc1.bias"] = init.bias(ffn)
    t[f"{prefix}fc2.weight"] = init.weight(d, ffn)
    t[f"{prefix}fc2.bias"] = init.bias(d)
    return t


def whisper_tensors(
    seed: int, config: dict, device="cpu", dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Every tensor a transformers WhisperModel of `config` has (names and shapes taken from
    the model built on the meta device, so nothing is allocated or drawn by transformers)."""
    from transformers import WhisperConfig, WhisperModel

    hf_config = WhisperConfig(**{k: v for k, v in config.items() if k not in ("architectures", "transformers_version")})
    with torch.device("meta"):
        shapes = {name: tuple(p.shape) for name, p in WhisperModel(hf_config).state_dict().items()}
    init = SeededInit(seed, 2, device, dtype)
    t = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name == "encoder.embed_positions.weight":
            t[name] = init.fixed(_sinusoids(*shape))
        elif "layer_norm" in name:
            t[name] = init.ones(*shape) if name.endswith("weight") else init.zeros(*shape)
        elif name.endswith("bias"):
            t[name] = init.bias(shape[0])
        else:
            t[name] = init.weight(*shape)
    return t


def glm_config(shape: StackShape) -> dict:
    glm = shape.glm
    config = _whisper_keys(WhisperShape(d_model=glm.d_model, layers=glm.layers, heads=glm.heads, ffn=glm.ffn))
    config["architectures"] = ["WhisperVQEncoder"]
    config.update(
        encoder_causal_attention=False,
        encoder_causal_convolution=True,
        pooling_kernel_size=glm.pooling,
        pooling_position=glm.quantize_position,
        pooling_type="avg",
        quantize_causal_block_size=glm.block,
        quantize_causal_encoder=False,
        quantize_commit_coefficient=0.25,
        quantize_ema_decay=0.99,
        quantize_encoder_only=True,
        quantize_loss_scale=10.0,
        quantize_position=glm.quantize_position,
        quantize_restart_interval=100,
        quantize_vocab_size=shape.codes,
        skip_language_detection=True,
    )
    return dict(sorted(config.items()))


def glm_tensors(seed: int, shape: StackShape, device="cpu") -> dict[str, torch.Tensor]:
    """The quantizing encoder's tensors, float32 as official (and as GLM-4-Voice runs it)."""
    init = SeededInit(seed, 3, device)
    glm = shape.glm
    d = glm.d_model
    t = {
        "conv1.weight": init.weight(d, 128, 3),
        "conv1.bias": init.bias(d),
        "conv2.weight": init.weight(d, d, 3),
        "conv2.bias": init.bias(d),
        "embed_positions.weight": init.fixed(_sinusoids(MAX_SOURCE_POSITIONS, d)),
        "embed_positions2.weight": init.fixed(_sinusoids(MAX_SOURCE_POSITIONS // glm.pooling, d)),
    }
    # quantize_encoder_only: only the layers before the quantizer exist.
    for i in range(glm.quantize_position):
        t.update(_encoder_layer_tensors(init, f"layers.{i}.", d, glm.ffn))
    # Rows of equal norm, so the nearest code depends on direction and every code gets used.
    codebook = init.normal((shape.codes, d), 1.0)
    codebook = codebook / codebook.norm(dim=1, keepdim=True) * math.sqrt(d)
    t["codebook.weight"] = codebook
    t["ema_count"] = init.ones(shape.codes)
    t["ema_weight"] = codebook.clone()
    return t
