"""A ModelStack with random weights in the real shapes, for the full-size bench (no files).

`build_random_stack(config, "full")` builds every part of Kimi-Audio-7B-Instruct in its real
shapes (docs/official-model.md): the Whisper-large-v3 encoder, the GLM-4-Voice tokenizer's
WhisperVQEncoder (float32, as official), the 7B LM (decode_7b.random_lm), the detokenizer's DiT
and the BigVGAN vocoder; "tiny" builds the same parts through the same code at toy sizes, so
the CPU tests keep it working. Each model is made on the "meta" device and allocated once on the
target device (no CPU copy of the weights), then filled from a seeded device generator. The
text tokenizer and its special tokens come from the demo checkpoint (written once under the
data dir); the returned ModelStack is what the pipeline runs.

Random weights would sample speech codes rarely (they are 16,384 of 168,448 ids), so the rows
of `mimo_output` that are not speech codes are zero: every audio step yields a code, as a real
reply does (and msg_end never comes: turns end at their max_new_tokens).
"""

from __future__ import annotations

import time

import torch
from torch import nn

from kimiaudio.audio.glm4_tokenizer import Glm4SpeechTokenizer
from kimiaudio.audio.log_mel import MelSettings
from kimiaudio.audio.whisper_features import WhisperFeatureEncoder
from kimiaudio.audio.whisper_vq_encoder import WhisperVQConfig
from kimiaudio.bench.decode_7b import KIMI_AUDIO_7B, random_lm
from kimiaudio.models.bigvgan import kaiser_sinc_lowpass
from kimiaudio.checkpoint.paths import find_checkpoint, resolve_device, resolve_dtype
from kimiaudio.config import Config
from kimiaudio.detok.detokenizer import Detokenizer
from kimiaudio.errors import KimiAudioError
from kimiaudio.models.bigvgan import BigVGAN, VocoderConfig
from kimiaudio.models.dit import DiTPrefix
from kimiaudio.models.dit_config import DiTConfig
from kimiaudio.models.kimia_config import KimiaConfig

MEL_STATS = dict(normalize_mel=True, mel_mean=-4.479605, mel_std=3.4584913)  # the real config.yaml's
SHAPES = {
    "full": dict(
        lm=KIMI_AUDIO_7B, codes=16384,
        whisper=dict(d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120),
        glm=dict(d_model=1280, layers=16, heads=20, ffn=5120),
        dit=dict(hidden_size=2304, depth=16, num_heads=18, mlp_ratio=4.0),
        vocoder=dict(upsample_rates=(5, 2, 2, 2, 2, 3, 2), upsample_kernel_sizes=(9, 4, 4, 4, 4, 5, 4),
                     upsample_initial_channel=2048, resblock_kernel_sizes=(3, 5, 7, 11)),
    ),
    "tiny": dict(
        lm=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                kimia_mimo_layers=1, kimia_mimo_transformer_from_layer_index=1, kimia_adaptor_input_dim=4 * 32,
                rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=8192),
        codes=256,
        whisper=dict(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64),
        glm=dict(d_model=32, layers=2, heads=2, ffn=64),
        dit=dict(hidden_size=64, depth=2, num_heads=4, mlp_ratio=2.0),
        vocoder=dict(upsample_rates=(8, 6, 10), upsample_kernel_sizes=(16, 12, 20), upsample_initial_channel=32,
                     resblock_kernel_sizes=(3, 7)),
    ),
}
MAX_SOURCE_POSITIONS = 1500  # Whisper's 30 s at 50 Hz, both encoders


def build_random_stack(config: Config, shape: str = "full", seed: int = 0):
    """A pipeline.model_stack.ModelStack with random weights in `shape` ("full" or "tiny") on
    config.model.device / dtype (the GLM encoder in float32, as official)."""
    from kimiaudio.random_weights.demo_checkpoint import ensure_demo_checkpoint
    from kimiaudio.pipeline.model_stack import ModelStack
    from kimiaudio.text.special_tokens import SpecialTokens
    from kimiaudio.text.tokenizer import KimiTokenizer

    if shape not in SHAPES:
        raise KimiAudioError(f"random stack shape {shape!r}: expected one of {', '.join(SHAPES)}")
    sizes = SHAPES[shape]
    device = resolve_device(config.model.device)
    dtype = resolve_dtype(config.model.dtype, device)
    paths = find_checkpoint(ensure_demo_checkpoint(config.data_dir))  # its tokenizer and special tokens
    tokenizer = KimiTokenizer.from_checkpoint(paths)
    gen = torch.Generator(device=device).manual_seed(seed)
    seconds: dict[str, float] = {}

    def timed(name, build):
        start = time.perf_counter()
        part = build()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds[name] = time.perf_counter() - start
        return part

    lm_dict = _lm_dict(sizes, tokenizer)
    specials = SpecialTokens.from_tokenizer(tokenizer, lm_dict, source=f"random-weights-{shape}")
    lm = timed("lm", lambda: _speech_head_only(random_lm(KimiaConfig.from_dict(lm_dict, f"random-weights-{shape}"),
                                                         device, dtype, seed), lm_dict["kimia_token_offset"]))
    whisper = timed("whisper", lambda: _whisper(sizes["whisper"], device, dtype, gen))
    glm4 = timed("glm4_tokenizer", lambda: _glm(sizes["glm"], sizes["codes"], device, gen))
    detok = None
    if not config.model.text_only:
        detok = timed("detokenizer", lambda: Detokenizer(_dit(sizes, device, dtype, gen),
                                                         _vocoder(sizes["vocoder"], device, dtype, gen), config.detok))
    return ModelStack(config, paths, device, dtype, tokenizer, specials, lm, whisper, glm4, detok, seconds)


def _lm_dict(sizes: dict, tokenizer) -> dict:
    """The LM config: the shape's sizes, speech codes after the demo tokenizer's text ids (full:
    the real offset 152064), media ids from the tokenizer (the forward finds features by them)."""
    lm = dict(sizes["lm"])
    offset = lm.get("kimia_token_offset", tokenizer.vocab_size)
    lm.update(kimia_token_offset=offset, vocab_size=offset + sizes["codes"],
              kimia_media_begin=tokenizer.special_id("<|im_media_begin|>"),
              kimia_media_end=tokenizer.special_id("<|im_media_end|>"))
    return lm


@torch.no_grad()
def _speech_head_only(lm, offset: int):
    lm.mimo_output.weight[:offset].zero_()  # audio logits: 0 for non-code ids, random for codes
    return lm


@torch.no_grad()
def _fill(module: nn.Module, gen: torch.Generator, std: float = 0.02) -> nn.Module:
    """N(0, std) matrices, zero vectors (biases), unit LayerNorm scales."""
    for name, param in module.named_parameters():
        if param.dim() == 1:
            param.fill_(1.0 if "norm" in name and name.endswith("weight") else 0.0)
        else:
            param.normal_(0.0, std, generator=gen)
    return module.eval().requires_grad_(False)


def _whisper(sizes: dict, device, dtype, gen) -> WhisperFeatureEncoder:
    from transformers import WhisperConfig

    config = WhisperConfig(num_mel_bins=128, max_source_positions=MAX_SOURCE_POSITIONS, **sizes)
    encoder = _fill(WhisperFeatureEncoder.empty_encoder(config, device, dtype), gen)
    return WhisperFeatureEncoder(encoder, MelSettings(num_mel_bins=128), device, dtype)


def _glm(sizes: dict, codes: int, device, gen) -> Glm4SpeechTokenizer:
    d, layers = sizes["d_model"], sizes["layers"]
    config = WhisperVQConfig(
        d_model=d, num_heads=sizes["heads"], ffn_dim=sizes["ffn"], num_mel_bins=128,
        max_source_positions=MAX_SOURCE_POSITIONS, activation_function="gelu", quantize_position=layers,
        quantize_vocab_size=codes, pooling_kernel_size=4, pooling_type="avg", pooling_position=layers,
        quantize_causal_block_size=200, causal_convolution=True, causal_attention=False)
    model = _fill(Glm4SpeechTokenizer.empty_model(config, device), gen)
    with torch.no_grad():
        model.codebook.weight.normal_(0.0, 1.0, generator=gen)  # codes of the same scale as the frames
    return Glm4SpeechTokenizer(model, MelSettings(num_mel_bins=128), device)


def _dit(sizes: dict, device, dtype, gen) -> DiTPrefix:
    cfg = DiTConfig(input_size=80, semantic_vocab_size=sizes["codes"], use_rope=True, rope_max_positions=4096,
                    rope_base=10000.0, rope_interpolation_factor=1.0, position_embedding_type="skip",
                    max_seq_len=4096, **sizes["dit"], **MEL_STATS)
    with torch.device("meta"):
        dit = DiTPrefix(cfg)
    return _fill(dit.to(dtype).to_empty(device=device), gen)


def _vocoder(sizes: dict, device, dtype, gen) -> BigVGAN:
    kernels = sizes["resblock_kernel_sizes"]
    cfg = VocoderConfig(num_mels=80, resblock="1", resblock_dilation_sizes=((1, 3, 5),) * len(kernels),
                        activation="snakebeta", snake_logscale=True, use_tanh_at_final=False,
                        use_bias_at_final=False, sampling_rate=24000, **sizes)
    with torch.device("meta"):
        vocoder = BigVGAN(cfg)
    vocoder = _fill(vocoder.to(dtype).to_empty(device=device), gen)
    with torch.no_grad():
        lowpass = kaiser_sinc_lowpass(cutoff=0.25, half_width=0.3, taps=12)  # ratio 2, as BigVGAN's
        for name, buffer in vocoder.named_buffers():
            if name.endswith("filter"):
                buffer.copy_(lowpass)
        for name, param in vocoder.named_parameters():
            if name.endswith("weight_g"):
                param.fill_(1.0)  # each output channel's weight of unit norm
    return vocoder.fold_weight_norm()
