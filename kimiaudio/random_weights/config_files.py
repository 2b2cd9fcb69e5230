"""The small files of a random checkpoint of a StackShape (shapes.py): the text tokenizer and
every part's config, with the official file names and keys.

The demo checkpoint is these files plus its weight files (demo_checkpoint.py); the in-memory
stacks (modules.py) parse them with the loaders' own parsers, so both start from the same text.
"""

from __future__ import annotations

import json
from pathlib import Path

from kimiaudio.random_weights import encoders, lm, speech_output
from kimiaudio.random_weights.shapes import StackShape

# The directories of the official layout (moonshotai/Kimi-Audio-7B-Instruct, plus
# THUDM/glm-4-voice-tokenizer's beside them).
WHISPER_DIR = "whisper-large-v3"
GLM_DIR = "glm-4-voice-tokenizer"
DETOKENIZER_DIR = "audio_detokenizer"
VOCODER_DIR = "vocoder"


def write_config_files(out: Path, shape: StackShape) -> None:
    """Write the tokenizer and the configs of `shape` into `out` (an empty directory)."""
    import yaml

    (out / "tiktoken.model").write_text(lm.tiktoken_model(), encoding="utf-8")
    write_json(out / "tokenizer_config.json", lm.tokenizer_config())
    write_json(out / "config.json", lm.lm_config(shape))
    for name in (WHISPER_DIR, GLM_DIR, DETOKENIZER_DIR, VOCODER_DIR):
        (out / name).mkdir()
    write_json(out / WHISPER_DIR / "config.json", encoders.whisper_config(shape))
    write_json(out / WHISPER_DIR / "preprocessor_config.json", encoders.preprocessor_config())
    write_json(out / GLM_DIR / "config.json", encoders.glm_config(shape))
    write_json(out / GLM_DIR / "preprocessor_config.json", encoders.preprocessor_config())
    (out / DETOKENIZER_DIR / "config.yaml").write_text(
        yaml.safe_dump(speech_output.dit_yaml(shape), sort_keys=False), encoding="utf-8"
    )
    write_json(out / VOCODER_DIR / "config.json", speech_output.vocoder_config(shape), sort_keys=False)


def write_json(path: Path, data: dict, sort_keys: bool = True) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=sort_keys, ensure_ascii=False) + "\n", encoding="utf-8")
