"""Configs and seeded random tensors of the audio parts of the demo checkpoint.

whisper-large-v3/ (a transformers WhisperModel), glm-4-voice-tokenizer/ (GLM-4-Voice's
WhisperVQEncoder, quantizer layers only), audio_detokenizer/ (the DiT of the flow-matching
detokenizer) and vocoder/ (BigVGAN): the official config keys and tensor names, tiny sizes.
kimiaudio/demo_checkpoint.py writes them to disk. Fixed parts are computed as the official
code computes them (whisper's sinusoid positions, BigVGAN's kaiser-sinc anti-alias filters).
"""

from __future__ import annotations

import math

import torch

NUM_CODES = 256  # GLM-4-Voice codebook size = LM audio codes = DiT semantic vocab (real: 16384)
WHISPER = dict(d_model=64, encoder_layers=2, heads=2, ffn=128, decoder_layers=1, max_target=16, vocab=64)
GLM = dict(d_model=64, encoder_layers=4, quantize_position=2, heads=2, ffn=128, pooling=4, block=200)
DIT = dict(hidden=128, depth=2, heads=4, mlp_ratio=2.0)
VOCODER = dict(upsample_rates=[8, 6, 10], upsample_kernel_sizes=[16, 12, 20], channels=32, kernels=[3, 7])
MAX_SOURCE_POSITIONS = 1500  # whisper 30 s at 50 Hz
NUM_MELS = 80


class SeededInit:
    """Seeded tensors: weights N(0, 1/sqrt(fan_in)) clipped to [0.02, 0.2], small biases.
    One generator per part (`part`), so changing one part leaves the others' values alone."""

    def __init__(self, seed: int, part: int):
        self.gen = torch.Generator().manual_seed(seed * 1009 + part)

    def normal(self, shape, std: float) -> torch.Tensor:
        return torch.randn(tuple(shape), generator=self.gen) * std

    def weight(self, *shape: int, fan_in: int | None = None, gain: float = 1.0) -> torch.Tensor:
        fan = fan_in if fan_in is not None else math.prod(shape[1:])
        return self.normal(shape, gain * min(0.2, max(0.02, fan**-0.5)))

    def bias(self, n: int) -> torch.Tensor:
        return self.normal((n,), 0.02)


# ---- whisper-large-v3 and glm-4-voice-tokenizer (both Whisper encoders) ----------------------


def whisper_config(sizes: dict | None = None) -> dict:
    """The config.json keys transformers 4.51 writes for a WhisperModel, in sorted order."""
    sizes = sizes or WHISPER
    d_model, encoder_layers, heads, ffn = sizes["d_model"], sizes["encoder_layers"], sizes["heads"], sizes["ffn"]
    return {
        "activation_dropout": 0.0,
        "activation_function": "gelu",
        "apply_spec_augment": False,
        "architectures": ["WhisperModel"],
        "attention_dropout": 0.0,
        "begin_suppress_tokens": None,
        "bos_token_id": WHISPER["vocab"] - 2,
        "classifier_proj_size": 256,
        "d_model": d_model,
        "decoder_attention_heads": heads,
        "decoder_ffn_dim": ffn,
        "decoder_layerdrop": 0.0,
        "decoder_layers": WHISPER["decoder_layers"],
        "decoder_start_token_id": WHISPER["vocab"] - 3,
        "dropout": 0.0,
        "encoder_attention_heads": heads,
        "encoder_ffn_dim": ffn,
        "encoder_layerdrop": 0.0,
        "encoder_layers": encoder_layers,
        "eos_token_id": WHISPER["vocab"] - 2,
        "init_std": 0.02,
        "is_encoder_decoder": True,
        "mask_feature_length": 10,
        "mask_feature_min_masks": 0,
        "mask_feature_prob": 0.0,
        "mask_time_length": 10,
        "mask_time_min_masks": 2,
        "mask_time_prob": 0.05,
        "max_source_positions": MAX_SOURCE_POSITIONS,
        "max_target_positions": WHISPER["max_target"],
        "median_filter_width": 7,
        "model_type": "whisper",
        "num_hidden_layers": encoder_layers,
        "num_mel_bins": 128,
        "pad_token_id": WHISPER["vocab"] - 1,
        "scale_embedding": False,
        "torch_dtype": "float32",
        "transformers_version": "4.51.3",
        "use_cache": True,
        "use_weighted_layer_sum": False,
        "vocab_size": WHISPER["vocab"],
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
        t[f"{prefix}{norm}.weight"] = torch.ones(d)
        t[f"{prefix}{norm}.bias"] = torch.zeros(d)
    t[f"{prefix}fc1.weight"] = init.weight(ffn, d)
    t[f"{prefix}fc1.bias"] = init.bias(ffn)
    t[f"{prefix}fc2.weight"] = init.weight(d, ffn)
    t[f"{prefix}fc2.bias"] = init.bias(d)
    return t


def whisper_tensors(seed: int, config: dict) -> dict[str, torch.Tensor]:
    """Every tensor a transformers WhisperModel of `config` has (names and shapes taken from
    the model built on the meta device, so nothing is allocated or drawn by transformers)."""
    from transformers import WhisperConfig, WhisperModel

    hf_config = WhisperConfig(**{k: v for k, v in config.items() if k not in ("architectures", "transformers_version")})
    with torch.device("meta"):
        shapes = {name: tuple(p.shape) for name, p in WhisperModel(hf_config).state_dict().items()}
    init = SeededInit(seed, 2)
    t = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name == "encoder.embed_positions.weight":
            t[name] = _sinusoids(*shape)
        elif "layer_norm" in name:
            t[name] = torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)
        elif name.endswith("bias"):
            t[name] = init.bias(shape[0])
        else:
            t[name] = init.weight(*shape)
    return t


def glm_config() -> dict:
    config = whisper_config(GLM)
    config["architectures"] = ["WhisperVQEncoder"]
    config.update(
        encoder_causal_attention=False,
        encoder_causal_convolution=True,
        pooling_kernel_size=GLM["pooling"],
        pooling_position=GLM["quantize_position"],
        pooling_type="avg",
        quantize_causal_block_size=GLM["block"],
        quantize_causal_encoder=False,
        quantize_commit_coefficient=0.25,
        quantize_ema_decay=0.99,
        quantize_encoder_only=True,
        quantize_loss_scale=10.0,
        quantize_position=GLM["quantize_position"],
        quantize_restart_interval=100,
        quantize_vocab_size=NUM_CODES,
        skip_language_detection=True,
    )
    return dict(sorted(config.items()))


def glm_tensors(seed: int) -> dict[str, torch.Tensor]:
    init = SeededInit(seed, 3)
    d = GLM["d_model"]
    t = {
        "conv1.weight": init.weight(d, 128, 3),
        "conv1.bias": init.bias(d),
        "conv2.weight": init.weight(d, d, 3),
        "conv2.bias": init.bias(d),
        "embed_positions.weight": _sinusoids(MAX_SOURCE_POSITIONS, d),
        "embed_positions2.weight": _sinusoids(MAX_SOURCE_POSITIONS // GLM["pooling"], d),
    }
    # quantize_encoder_only: only the layers before the quantizer exist.
    for i in range(GLM["quantize_position"]):
        t.update(_encoder_layer_tensors(init, f"layers.{i}.", d, GLM["ffn"]))
    # Rows of equal norm, so the nearest code depends on direction and every code gets used.
    codebook = init.normal((NUM_CODES, d), 1.0)
    codebook = codebook / codebook.norm(dim=1, keepdim=True) * math.sqrt(d)
    t["codebook.weight"] = codebook
    t["ema_count"] = torch.ones(NUM_CODES)
    t["ema_weight"] = codebook.clone()
    return t


# ---- audio detokenizer (DiT flow matching) ------------------------------------------------


def dit_yaml() -> dict:
    return {
        "model": {
            "dit": {
                "input_size": NUM_MELS,
                "semantic_vocab_size": NUM_CODES,
                "hidden_size": DIT["hidden"],
                "depth": DIT["depth"],
                "num_heads": DIT["heads"],
                "mlp_ratio": DIT["mlp_ratio"],
                "ffn_type": "vanilla_mlp",
                "ffn_gated_glu": False,
                "ffn_act_layer": "gelu",
                "ffn_conv_kernel_size": 5,
                "use_rope": True,
                "rope_params": {"max_position_embeddings": 4096, "rope_base": 10000.0, "rope_interpolation_factor": 1.0},
                "position_embedding_type": "skip",
                "max_seq_len": 4096,
            }
        },
        # The real checkpoint's mel statistics, so the random DiT's unit-scale output lands in
        # a plausible natural-log mel range before the vocoder.
        "normalize_mel": True,
        "mel_mean": -4.479605,
        "mel_std": 3.4584913,
    }


def dit_tensors(seed: int) -> dict[str, torch.Tensor]:
    init = SeededInit(seed, 4)
    h, ffn = DIT["hidden"], int(DIT["hidden"] * DIT["mlp_ratio"])
    p = "speech_model."
    t = {
        p + "t_embedder.mlp.0.weight": init.weight(h, 256),
        p + "t_embedder.mlp.0.bias": init.bias(h),
        p + "t_embedder.mlp.2.weight": init.weight(h, h),
        p + "t_embedder.mlp.2.bias": init.bias(h),
        # +1 row: the null condition of classifier-free guidance
        p + "semantic_token_embedding.weight": init.normal((NUM_CODES + 1, h), 1.0),
        p + "input_linear.weight": init.weight(h, NUM_MELS),
        p + "input_linear.bias": init.bias(h),
    }
    for i in range(DIT["depth"]):
        b = f"{p}blocks.{i}."
        t[b + "attn.qkv.weight"] = init.weight(3 * h, h)
        t[b + "attn.qkv.bias"] = init.bias(3 * h)
        t[b + "attn.proj.weight"] = init.weight(h, h)
        t[b + "attn.proj.bias"] = init.bias(h)
        t[b + "mlp.fc1.weight"] = init.weight(ffn, h)
        t[b + "mlp.fc1.bias"] = init.bias(ffn)
        t[b + "mlp.fc2.weight"] = init.weight(h, ffn)
        t[b + "mlp.fc2.bias"] = init.bias(h)
        # half gain: shift/scale/gate stay small, the blocks perturb rather than replace x
        t[b + "adaLN_modulation.1.weight"] = init.weight(6 * h, h, gain=0.5)
        t[b + "adaLN_modulation.1.bias"] = init.bias(6 * h)
    t[p + "final_layer.linear.weight"] = init.weight(NUM_MELS, h)
    t[p + "final_layer.linear.bias"] = init.bias(NUM_MELS)
    t[p + "final_layer.adaLN_modulation.1.weight"] = init.weight(2 * h, h, gain=0.5)
    t[p + "final_layer.adaLN_modulation.1.bias"] = init.bias(2 * h)
    return t


# ---- vocoder (BigVGAN) ------------------------------------------------------------------


def vocoder_config() -> dict:
    kernels = VOCODER["kernels"]
    return {
        "resblock": "1",
        "num_gpus": 0,
        "batch_size": 32,
        "learning_rate": 0.0001,
        "adam_b1": 0.8,
        "adam_b2": 0.99,
        "lr_decay": 0.999,
        "seed": 1234,
        "upsample_rates": VOCODER["upsample_rates"],  # product = hop_size 480 (50 Hz -> 24 kHz)
        "upsample_kernel_sizes": VOCODER["upsample_kernel_sizes"],
        "upsample_initial_channel": VOCODER["channels"],
        "resblock_kernel_sizes": kernels,
        "resblock_dilation_sizes": [[1, 3, 5] for _ in kernels],
        "activation": "snakebeta",
        "snake_logscale": True,
        "use_tanh_at_final": False,
        "use_bias_at_final": False,
        "segment_size": 24000,
        "num_mels": NUM_MELS,
        "num_freq": 961,
        "n_fft": 1920,
        "hop_size": 480,
        "win_size": 1920,
        "sampling_rate": 24000,
        "fmin": 0,
        "fmax": None,
        "fmax_for_loss": None,
    }


def kaiser_sinc_lowpass(cutoff: float, half_width: float, taps: int) -> torch.Tensor:
    """BigVGAN's anti-aliasing low-pass filter [1, 1, taps]: a kaiser-windowed sinc with the
    window's beta from the Kaiser design formula for a transition band of `half_width`,
    normalised to unit DC gain."""
    half = taps // 2
    attenuation = 2.285 * (half - 1) * math.pi * (4 * half_width) + 7.95
    if attenuation > 50.0:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21.0:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21.0)
    else:
        beta = 0.0
    window = torch.kaiser_window(taps, periodic=False, beta=beta)
    time = torch.arange(-half, half) + 0.5 if taps % 2 == 0 else torch.arange(taps) - half
    kernel = 2 * cutoff * window * torch.sinc(2 * cutoff * time)
    return (kernel / kernel.sum()).view(1, 1, taps)


def _weight_norm_conv(init: SeededInit, t: dict, prefix: str, shape: tuple, fan_in: int, gain: float = 1.0, bias: int | None = None):
    """weight_norm(dim=0) parameters whose weight g * v/|v| equals a N(0, gain/sqrt(fan_in)) draw."""
    v = init.weight(*shape, fan_in=fan_in)
    t[prefix + "weight_g"] = gain * v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
    t[prefix + "weight_v"] = v
    if bias is not None:
        t[prefix + "bias"] = init.bias(bias)


def _anti_aliased_snake(t: dict, prefix: str, channels: int) -> None:
    # SnakeBeta with log-scale parameters: zeros = alpha = beta = 1 (BigVGAN's init).
    t[prefix + "act.alpha"] = torch.zeros(channels)
    t[prefix + "act.beta"] = torch.zeros(channels)
    lowpass = kaiser_sinc_lowpass(cutoff=0.25, half_width=0.3, taps=12)  # ratio 2: 0.5/2, 0.6/2
    t[prefix + "upsample.filter"] = lowpass.clone()
    t[prefix + "downsample.lowpass.filter"] = lowpass.clone()


def vocoder_tensors(seed: int) -> dict[str, torch.Tensor]:
    init = SeededInit(seed, 5)
    cfg = vocoder_config()
    ch = cfg["upsample_initial_channel"]
    t: dict[str, torch.Tensor] = {}
    _weight_norm_conv(init, t, "conv_pre.", (ch, NUM_MELS, 7), fan_in=NUM_MELS * 7, bias=ch)
    for i, (rate, k) in enumerate(zip(cfg["upsample_rates"], cfg["upsample_kernel_sizes"])):
        c_in, c_out = ch // 2**i, ch // 2 ** (i + 1)
        # ConvTranspose1d weight [in, out, k]; each output sample sees k/rate taps per input channel
        _weight_norm_conv(init, t, f"ups.{i}.0.", (c_in, c_out, k), fan_in=c_in * k // rate, bias=c_out)
    num_kernels = len(cfg["resblock_kernel_sizes"])
    for i in range(len(cfg["upsample_rates"])):
        c = ch // 2 ** (i + 1)
        for j, (k, dilations) in enumerate(zip(cfg["resblock_kernel_sizes"], cfg["resblock_dilation_sizes"])):
            r = f"resblocks.{i * num_kernels + j}."
            for group in ("convs1", "convs2"):
                for n in range(len(dilations)):
                    _weight_norm_conv(init, t, f"{r}{group}.{n}.", (c, c, k), fan_in=c * k, bias=c)
            for n in range(2 * len(dilations)):
                _anti_aliased_snake(t, f"{r}activations.{n}.", c)
    c_last = ch // 2 ** len(cfg["upsample_rates"])
    _anti_aliased_snake(t, "activation_post.", c_last)
    # The random stack's output is loud (rms ~20 for seed 0); this gain brings the noise the demo
    # speaks to rms ~0.1, peaks ~0.5, inside the final clamp(-1, 1) instead of clipped.
    _weight_norm_conv(init, t, "conv_post.", (1, c_last, 7), fan_in=c_last * 7, gain=0.004)
    return t


