"""Write the tiny random-weight demo checkpoint, in exactly the official layout.

Same file names, config keys and tensor names as moonshotai/Kimi-Audio-7B-Instruct (plus a
glm-4-voice-tokenizer/ directory, as THUDM/glm-4-voice-tokenizer has it), so the demo runs
through the same loaders as the real model; only the sizes are tiny. Every value comes from a
seeded torch.Generator (one per part), so the same seed gives byte-identical files. The
weights are random: the demo speaks noise. `DEMO_MARKER` in the root says so.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from kimiaudio.checkpoint import demo_audio as parts
from kimiaudio.checkpoint.paths import DEMO_MARKER, find_checkpoint
from kimiaudio.checkpoint.demo_audio import NUM_CODES, WHISPER, SeededInit
from kimiaudio.errors import CheckpointError, KimiAudioError
from kimiaudio.text.special_tokens import official_special_names

GENERATOR_VERSION = 2  # bump when the written weights change: older demo checkpoints are rewritten
DEMO_DIR_NAME = "demo-checkpoint"

NUM_BYTE_TOKENS = 256  # the text vocabulary: one BPE rank per byte, no merges
NUM_SPECIAL = 64  # the first 64 special tokens, in the official order
NUM_AUDIO_SPECIAL = 16  # only named in config.json (real: 512)
LM = dict(hidden=128, ffn=256, layers=4, heads=4, kv_heads=2, mimo_layers=2, mimo_from=2)
# The mimo_output row of <|im_msg_end|> is scaled by this factor so that, with the default
# sampling (audio temperature 0.8, top-k 10), seed-0 demo replies end after a few seconds:
# measured over 8 prompts x 5 seeds, 10..80 audio steps (median ~40 = 3 s). 1.0 gives a median
# of ~75 steps with a long tail, 2.0 ~17. An ordinary weight; the marker file records it.
MSG_END_ROW_SCALE = 1.5
# Likewise the lm_head row of <|im_kimia_text_eos|>: text is decoded greedily by default, and
# at 1.0 the demo LM never picks EOS, so a transcription ran to the official 7500-position
# limit. At 2.0, over 6 inputs: ASR answers 3..85 text tokens, spoken answers' text 7..19.
TEXT_EOS_ROW_SCALE = 2.0


def write_demo_checkpoint(out_dir: str | Path, seed: int = 0, progress: bool = False) -> Path:
    """Write every file of the demo checkpoint into `out_dir` (created; must be empty)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise KimiAudioError(f"{out}: not empty; the demo checkpoint is written into an empty directory")
    steps = [_write_text_tokenizer, _write_lm, _write_whisper, _write_glm, _write_detokenizer, _write_vocoder, _write_marker]
    for step in _progress(steps, progress):
        step(out, seed)
    return out


def ensure_demo_checkpoint(data_dir: str | Path, seed: int = 0, progress: bool = False) -> Path:
    """`data_dir/demo-checkpoint`, written once (in a temporary directory, then renamed, so a
    crash never leaves a half-written checkpoint behind) and reused when complete."""
    target = Path(data_dir) / DEMO_DIR_NAME
    if _is_complete(target):
        if _generator_version(target) == GENERATOR_VERSION:
            return target
        shutil.rmtree(target)  # our own random weights from an older writer: replace them
    if target.exists():
        raise CheckpointError(f"{target}: incomplete demo checkpoint (no {DEMO_MARKER}); delete the directory to rewrite it")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEMO_DIR_NAME}-", dir=target.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the checkpoint is ordinary data
    try:
        write_demo_checkpoint(tmp, seed=seed, progress=progress)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_complete(target):  # not another process that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _generator_version(root: Path) -> int | None:
    try:
        return json.loads((root / DEMO_MARKER).read_text()).get("generator_version")
    except (OSError, ValueError, AttributeError):
        return None


def _is_complete(root: Path) -> bool:
    if not (root / DEMO_MARKER).is_file():
        return False
    try:
        find_checkpoint(root)
    except CheckpointError:
        return False
    return True


# ---- text tokenizer -------------------------------------------------------------------


def _write_text_tokenizer(out: Path, seed: int) -> None:
    import base64

    lines = [f"{base64.b64encode(bytes([i])).decode()} {i}\n" for i in range(NUM_BYTE_TOKENS)]
    (out / "tiktoken.model").write_text("".join(lines), encoding="utf-8")
    names = official_special_names(NUM_SPECIAL)
    added = {
        str(NUM_BYTE_TOKENS + i): dict(content=name, lstrip=False, normalized=False, rstrip=False, single_word=False, special=True)
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
    _write_json(out / "tokenizer_config.json", config)


def _special(name: str) -> int:
    return NUM_BYTE_TOKENS + official_special_names(NUM_SPECIAL).index(name)


# ---- LM (MoonshotKimiaForCausalLM) ----------------------------------------------------------


def _lm_config() -> dict:
    offset = NUM_BYTE_TOKENS + NUM_SPECIAL
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
        "hidden_size": LM["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": LM["ffn"],
        "kimia_adaptor_input_dim": 4 * WHISPER["d_model"],  # 4 stacked 50 Hz whisper frames
        "kimia_audio_output_vocab": NUM_CODES + NUM_AUDIO_SPECIAL,
        "kimia_media_begin": _special("<|im_media_begin|>"),
        "kimia_media_end": _special("<|im_media_end|>"),
        "kimia_mimo_audiodelaytokens": 6,
        "kimia_mimo_layers": LM["mimo_layers"],
        "kimia_mimo_transformer_from_layer_index": LM["mimo_from"],
        "kimia_text_output_vocab": offset,
        "kimia_token_offset": offset,
        "max_position_embeddings": 8192,
        "max_window_layers": 28,
        "model_type": "moonshot_kimia",
        "num_attention_heads": LM["heads"],
        "num_audio_special_tokens": NUM_AUDIO_SPECIAL,
        "num_base_tokens": NUM_BYTE_TOKENS,
        "num_hidden_layers": LM["layers"],
        "num_key_value_heads": LM["kv_heads"],
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
        "vocab_size": offset + NUM_CODES,
    }


def _lm_tensors(seed: int) -> dict[str, torch.Tensor]:
    init = SeededInit(seed, 1)
    cfg = _lm_config()
    h, ffn, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    adaptor_in = cfg["kimia_adaptor_input_dim"]
    t: dict[str, torch.Tensor] = {}
    # Embeddings at unit scale, like the LayerNorm'd adaptor output they are summed with.
    t["model.embed_tokens.weight"] = init.normal((vocab, h), 1.0)
    layers = [f"model.layers.{i}." for i in range(cfg["num_hidden_layers"])]
    layers += [f"model.mimo_layers.{i}." for i in range(cfg["kimia_mimo_layers"])]
    for p in layers:
        t[p + "input_layernorm.weight"] = torch.ones(h)
        t[p + "post_attention_layernorm.weight"] = torch.ones(h)
        for name, rows in (("q_proj", h), ("k_proj", kv), ("v_proj", kv)):
            t[p + f"self_attn.{name}.weight"] = init.weight(rows, h)
            t[p + f"self_attn.{name}.bias"] = init.bias(rows)
        t[p + "self_attn.o_proj.weight"] = init.weight(h, h)
        t[p + "mlp.gate_proj.weight"] = init.weight(ffn, h)
        t[p + "mlp.up_proj.weight"] = init.weight(ffn, h)
        t[p + "mlp.down_proj.weight"] = init.weight(h, ffn)
    t["model.norm.weight"] = torch.ones(h)
    t["model.mimo_norm.weight"] = torch.ones(h)
    # VQ adaptor: Linear(adaptor_in, h) . SiLU . Dropout . Linear(h, h) . LayerNorm(h)
    t["model.vq_adaptor.layers.0.weight"] = init.weight(h, adaptor_in)
    t["model.vq_adaptor.layers.0.bias"] = init.bias(h)
    t["model.vq_adaptor.layers.3.weight"] = init.weight(h, h)
    t["model.vq_adaptor.layers.3.bias"] = init.bias(h)
    t["model.vq_adaptor.layers.4.weight"] = torch.ones(h)
    t["model.vq_adaptor.layers.4.bias"] = torch.zeros(h)
    lm_head = init.weight(vocab, h)
    lm_head[_special("<|im_kimia_text_eos|>")] *= TEXT_EOS_ROW_SCALE
    t["lm_head.weight"] = lm_head
    mimo_output = init.weight(vocab, h)
    mimo_output[_special("<|im_msg_end|>")] *= MSG_END_ROW_SCALE
    t["mimo_output.weight"] = mimo_output
    return t


def _write_lm(out: Path, seed: int) -> None:
    _write_json(out / "config.json", _lm_config())
    _save_safetensors(_lm_tensors(seed), out / "model.safetensors")


# ---- audio parts (configs and tensors: demo_audio.py) ---------------------------------


def _write_whisper(out: Path, seed: int) -> None:
    config = parts.whisper_config()
    folder = out / "whisper-large-v3"
    folder.mkdir()
    _write_json(folder / "config.json", config)
    _write_json(folder / "preprocessor_config.json", parts.preprocessor_config())
    _save_safetensors(parts.whisper_tensors(seed, config), folder / "model.safetensors")


def _write_glm(out: Path, seed: int) -> None:
    folder = out / "glm-4-voice-tokenizer"
    folder.mkdir()
    _write_json(folder / "config.json", parts.glm_config())
    _write_json(folder / "preprocessor_config.json", parts.preprocessor_config())
    _save_safetensors(parts.glm_tensors(seed), folder / "model.safetensors")


def _write_detokenizer(out: Path, seed: int) -> None:
    import yaml

    folder = out / "audio_detokenizer"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(parts.dit_yaml(), sort_keys=False), encoding="utf-8")
    _save_torch({"state_dict": parts.dit_tensors(seed)}, folder / "model.pt")


def _write_vocoder(out: Path, seed: int) -> None:
    folder = out / "vocoder"
    folder.mkdir()
    _write_json(folder / "config.json", parts.vocoder_config(), sort_keys=False)
    _save_torch({"generator": parts.vocoder_tensors(seed)}, folder / "model.pt")


# ---- marker and file helpers --------------------------------------------------------------


def _write_marker(out: Path, seed: int) -> None:
    marker = {
        "kind": "kimiaudio demo checkpoint",
        "random_weights": True,
        "message": (
            "Tiny random-weight checkpoint in the official Kimi-Audio-7B-Instruct layout, for trying the server "
            "without the 20 GB download. Its replies are random tokens: the text is gibberish and the speech is noise."
        ),
        "use_real_weights": (
            "Download moonshotai/Kimi-Audio-7B-Instruct and THUDM/glm-4-voice-tokenizer, then run "
            "`python -m kimiaudio serve --model /path/to/Kimi-Audio-7B-Instruct` or set [model] path (and "
            "glm_tokenizer_path) in config.toml."
        ),
        "seed": seed,
        "generator_version": GENERATOR_VERSION,
        "tuning": {
            "mimo_output_msg_end_row_scale": MSG_END_ROW_SCALE,
            "lm_head_text_eos_row_scale": TEXT_EOS_ROW_SCALE,
            "why": (
                "the mimo_output row of <|im_msg_end|> is scaled so that, with the default sampling, speech "
                "replies end after about 20-80 audio tokens (a few seconds) instead of running to the length limit; "
                "the lm_head row of <|im_kimia_text_eos|> likewise, so text answers end"
            ),
        },
    }
    _write_json(out / DEMO_MARKER, marker)


def _write_json(path: Path, data: dict, sort_keys: bool = True) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=sort_keys, ensure_ascii=False) + "\n", encoding="utf-8")


def _save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def _save_torch(obj: dict, path: Path) -> None:
    torch.save(obj, str(path))


def _progress(steps: list, enabled: bool):
    if not enabled:
        return steps
    from tqdm import tqdm

    return tqdm(steps, desc="writing demo checkpoint", unit="part")
