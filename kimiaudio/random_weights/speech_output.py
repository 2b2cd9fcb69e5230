"""Configs and seeded random tensors of the speech output for a StackShape (shapes.py):
audio_detokenizer/ (the DiT of the flow-matching detokenizer) and vocoder/ (BigVGAN), the
official config keys and tensor names at the shape's sizes. BigVGAN's kaiser-sinc anti-alias
filters are computed as the official code computes them.
"""

from __future__ import annotations

import torch

from kimiaudio.models.kaiser_filter import kaiser_sinc_lowpass
from kimiaudio.random_weights.encoders import NUM_MELS
from kimiaudio.random_weights.seeded_init import SeededInit
from kimiaudio.random_weights.shapes import StackShape

# ---- audio detokenizer (DiT flow matching) ------------------------------------------------


def dit_yaml(shape: StackShape) -> dict:
    dit = shape.dit
    return {
        "model": {
            "dit": {
                "input_size": NUM_MELS,
                "semantic_vocab_size": shape.codes,
                "hidden_size": dit.hidden,
                "depth": dit.depth,
                "num_heads": dit.heads,
                "mlp_ratio": dit.mlp_ratio,
                "ffn_type": "vanilla_mlp",
                "ffn_gated_glu": False,
                "ffn_act_layer": "gelu",
                "ffn_conv_kernel_size": 5,
                "use_rope": True,
                "rope_params": {
                    "max_position_embeddings": 4096,
                    "rope_base": 10000.0,
                    "rope_interpolation_factor": 1.0,
                },
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


def dit_tensors(
    seed: int, shape: StackShape, device="cpu", dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    init = SeededInit(seed, 4, device, dtype)
    h, ffn = shape.dit.hidden, int(shape.dit.hidden * shape.dit.mlp_ratio)
    p = "speech_model."
    t = {
        p + "t_embedder.mlp.0.weight": init.weight(h, 256),
        p + "t_embedder.mlp.0.bias": init.bias(h),
        p + "t_embedder.mlp.2.weight": init.weight(h, h),
        p + "t_embedder.mlp.2.bias": init.bias(h),
        # +1 row: the null condition of classifier-free guidance
        p + "semantic_token_embedding.weight": init.normal((shape.codes + 1, h), 1.0),
        p + "input_linear.weight": init.weight(h, NUM_MELS),
        p + "input_linear.bias": init.bias(h),
    }
    for i in range(shape.dit.depth):
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


def vocoder_config(shape: StackShape) -> dict:
    vocoder = shape.vocoder
    kernels = list(vocoder.kernels)
    return {
        "resblock": "1",
        "num_gpus": 0,
        "batch_size": 32,
        "learning_rate": 0.0001,
        "adam_b1": 0.8,
        "adam_b2": 0.99,
        "lr_decay": 0.999,
        "seed": 1234,
        "upsample_rates": list(vocoder.upsample_rates),  # product = hop_size 480 (50 Hz -> 24 kHz)
        "upsample_kernel_sizes": list(vocoder.upsample_kernel_sizes),
        "upsample_initial_channel": vocoder.channels,
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


def _weight_norm_conv(
    init: SeededInit, t: dict, prefix: str, shape: tuple, fan_in: int, gain: float = 1.0, bias: int | None = None
):
    """weight_norm(dim=0) parameters whose weight g * v/|v| equals a N(0, gain/sqrt(fan_in)) draw."""
    v = init.weight(*shape, fan_in=fan_in)
    t[prefix + "weight_g"] = gain * v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
    t[prefix + "weight_v"] = v
    if bias is not None:
        t[prefix + "bias"] = init.bias(bias)


def _anti_aliased_snake(init: SeededInit, t: dict, prefix: str, channels: int) -> None:
    # SnakeBeta with log-scale parameters: zeros = alpha = beta = 1 (BigVGAN's init).
    t[prefix + "act.alpha"] = init.zeros(channels)
    t[prefix + "act.beta"] = init.zeros(channels)
    lowpass = kaiser_sinc_lowpass(cutoff=0.25, half_width=0.3, taps=12)  # ratio 2: 0.5/2, 0.6/2
    t[prefix + "upsample.filter"] = init.fixed(lowpass)
    t[prefix + "downsample.lowpass.filter"] = init.fixed(lowpass)


def vocoder_tensors(
    seed: int, shape: StackShape, device="cpu", dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    init = SeededInit(seed, 5, device, dtype)
    cfg = vocoder_config(shape)
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
                _anti_aliased_snake(init, t, f"{r}activations.{n}.", c)
    c_last = ch // 2 ** len(cfg["upsample_rates"])
    _anti_aliased_snake(init, t, "activation_post.", c_last)
    # The random stack's output is loud (rms ~20 for seed 0); this gain brings the noise the demo
    # speaks to rms ~0.1, peaks ~0.5, inside the final clamp(-1, 1) instead of clipped.
    _weight_norm_conv(init, t, "conv_post.", (1, c_last, 7), fan_in=c_last * 7, gain=0.004)
    return t
