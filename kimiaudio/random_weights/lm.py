"""The random checkpoints' text tokenizer and LM (MoonshotKimiaForCausalLM): the official config
keys and tensor names at a StackShape's sizes (shapes.py), seeded. Every shape shares the
tokenizer, so the special ids in config.json are the demo tokenizer's whatever the sizes."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from kimiaudio.random_weights.seeded_init import SeededInit
from kimiaudio.random_weights.shapes import StackShape
from kimiaudio.text.special_tokens import official_special_names

NUM_BYTE_TOKENS = 256  # the text vocabulary: one BPE rank per byte, no merges
NUM_SPECIAL = 64  # the first 64 special tokens, in the official order
# The mimo_output row of <|im_msg_end|> is scaled by this factor so that, with the default
# sampling (audio temperature 0.8, top-k 10), seed-0 demo replies end after a few seconds:
# measured over 8 prompts x 5 seeds, 10..80 audio steps (median ~40 = 3 s). 1.0 gives a median
# of ~75 steps with a long tail, 2.0 ~17. An ordinary weight; the marker file records it.
MSG_END_ROW_SCALE = 1.5
# Likewise the lm_head row of <|im_kimia_text_eos|>: text is decoded greedily by default, and
# at 1.0 the demo LM never picks EOS, so a transcription ran to the official 7500-position
# limit. At 2.0, over 6 inputs: ASR answers 3..85 text tokens, spoken answers' text 7..19.
TEXT_EOS_ROW_SCALE = 2.0


# ---- text tokenizer -------------------------------------------------------------------


def tiktoken_model() -> str:
    """tiktoken.model: one BPE rank per byte."""
    import base64

    return "".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n" for i in range(NUM_BYTE_TOKENS))


def tokenizer_config() -> dict:
    names = official_special_names(NUM_SPECIAL)
    added = {
        str(NUM_BYTE_TOKENS + i): dict(
            content=name, lstrip=False, normalized=False, rstrip=False, single_word=False, special=True
        )
        for i, name in enumerate(names)
    }
    config = {
        "added_tokens_decoder": added,
        "auto_map": {"AutoTokenizer": ["tokenization_kimia.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "model_max_length": 8192,
        "pad_token": names[-1],  # official: the last special token is the pad token
        "tokenizer_class": "TikTokenTokenizer",
    }
    return config


def _special(name: str) -> int:
    return NUM_BYTE_TOKENS + official_special_names(NUM_SPECIAL).index(name)


# ---- LM (MoonshotKimiaForCausalLM) ----------------------------------------------------------


def lm_config(shape: StackShape) -> dict:
    """config.json: the shape's sizes; speech codes at `token_offset`, by default right after
    the tokenizer's text and special ids."""
    lm = shape.lm
    offset = lm.token_offset if lm.token_offset is not None else NUM_BYTE_TOKENS + NUM_SPECIAL
    return {
        "architectures": ["MoonshotKimiaForCausalLM"],
        "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_moonshot_kimia.KimiAudioConfig",
            "AutoModel": "modeling_moonshot_kimia.MoonshotKimiaForCausalLM",
            "AutoModelForCausalLM": "modeling_moonshot_kimia.MoonshotKimiaForCausalLM",
        },
        "bos_token_id": _special("[BOS]"),
        "eos_token_id": _special("[EOS]"),
        "hidden_act": "silu",
        "hidden_size": lm.hidden,
        "initializer_range": 0.02,
        "intermediate_size": lm.ffn,
        "kimia_adaptor_input_dim": 4 * shape.whisper.d_model,  # 4 stacked 50 Hz whisper frames
        "kimia_audio_output_vocab": shape.codes + lm.audio_special,
        "kimia_media_begin": _special("<|im_media_begin|>"),
        "kimia_media_end": _special("<|im_media_end|>"),
        "kimia_mimo_audiodelaytokens": 6,
        "kimia_mimo_layers": lm.mimo_layers,
        "kimia_mimo_transformer_from_layer_index": lm.mimo_from,
        "kimia_text_output_vocab": offset,
        "kimia_token_offset": offset,
        "max_position_embeddings": 8192,
        "max_window_layers": 28,
        "model_type": "moonshot_kimia",
        "num_attention_heads": lm.heads,
        "num_audio_special_tokens": lm.audio_special,
        "num_base_tokens": NUM_BYTE_TOKENS,
        "num_hidden_layers": lm.layers,
        "num_key_value_heads": lm.kv_heads,
        "pad_token_id": _special(official_special_names(NUM_SPECIAL)[-1]),
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "4.51.3",  # the version whose config layout this copies
        "use_cache": True,
        "use_sliding_window": False,
        "use_whisper_feature": True,
        "vocab_size": offset + shape.codes,
    }


def lm_tensors(seed: int, cfg: dict, device="cpu", dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every tensor of the LM that config.json `cfg` describes, by its official name."""
    return dict(iter_lm_tensors(seed, cfg, device, dtype))


def iter_lm_tensors(
    seed: int, cfg: dict, device="cpu", dtype: torch.dtype = torch.float32
) -> Iterator[tuple[str, torch.Tensor]]:
    """lm_tensors one at a time, drawn as they are asked for (the same values in the same order),
    decoder layer after decoder layer: models.kimia_lm.assemble_lm finishes each layer before the
    next is drawn, so a full-size LM never exists in bf16 when it is quantized."""
    init = SeededInit(seed, 1, device, dtype)
    h, ffn, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    adaptor_in = cfg["kimia_adaptor_input_dim"]
    # Embeddings at unit scale, like the LayerNorm'd adaptor output they are summed with.
    yield "model.embed_tokens.weight", init.normal((vocab, h), 1.0)
    layers = [f"model.layers.{i}." for i in range(cfg["num_hidden_layers"])]
    layers += [f"model.mimo_layers.{i}." for i in range(cfg["kimia_mimo_layers"])]
    for p in layers:
        yield p + "input_layernorm.weight", init.ones(h)
        yield p + "post_attention_layernorm.weight", init.ones(h)
        for name, rows in (("q_proj", h), ("k_proj", kv), ("v_proj", kv)):
            yield p + f"self_attn.{name}.weight", init.weight(rows, h)
            yield p + f"self_attn.{name}.bias", init.bias(rows)
        yield p + "self_attn.o_proj.weight", init.weight(h, h)
        yield p + "mlp.gate_proj.weight", init.weight(ffn, h)
        yield p + "mlp.up_proj.weight", init.weight(ffn, h)
        yield p + "mlp.down_proj.weight", init.weight(h, ffn)
    yield "model.norm.weight", init.ones(h)
    yield "model.mimo_norm.weight", init.ones(h)
    # VQ adaptor: Linear(adaptor_in, h) . SiLU . Dropout . Linear(h, h) . LayerNorm(h)
    yield "model.vq_adaptor.layers.0.weight", init.weight(h, adaptor_in)
    yield "model.vq_adaptor.layers.0.bias", init.bias(h)
    yield "model.vq_adaptor.layers.3.weight", init.weight(h, h)
    yield "model.vq_adaptor.layers.3.bias", init.bias(h)
    yield "model.vq_adaptor.layers.4.weight", init.ones(h)
    yield "model.vq_adaptor.layers.4.bias", init.zeros(h)
    lm_head = init.weight(vocab, h)
    lm_head[_special("<|im_kimia_text_eos|>")] *= TEXT_EOS_ROW_SCALE
    yield "lm_head.weight", lm_head
    mimo_output = init.weight(vocab, h)
    mimo_output[_special("<|im_msg_end|>")] *= MSG_END_ROW_SCALE
    yield "mimo_output.weight", mimo_output
