"""Where each part of a checkpoint lives, and which device and dtype it runs on.

The layout is the one of moonshotai/Kimi-Audio-7B-Instruct (config.json, safetensors shards
with model.safetensors.index.json or one model.safetensors, tiktoken.model,
tokenizer_config.json, whisper-large-v3/, audio_detokenizer/, vocoder/) plus a
THUDM/glm-4-voice-tokenizer directory. File names are used unchanged. Every problem is a
CheckpointError naming the file and what was expected.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kimiaudio.errors import CheckpointError


@dataclass(frozen=True)
class CheckpointPaths:
    root: Path
    glm_tokenizer: Path
    text_only: bool = False

    @property
    def lm_config(self) -> Path:
        return self.root / "config.json"

    @property
    def tiktoken_model(self) -> Path:
        return self.root / "tiktoken.model"

    @property
    def tokenizer_config(self) -> Path:
        return self.root / "tokenizer_config.json"

    @property
    def whisper(self) -> Path:
        return self.root / "whisper-large-v3"

    @property
    def detokenizer(self) -> Path:
        return self.root / "audio_detokenizer"

    @property
    def vocoder(self) -> Path:
        return self.root / "vocoder"

    @property
    def is_demo(self) -> bool:
        """True for a checkpoint written by `kimiaudio demo-checkpoint` (random weights)."""
        return (self.root / DEMO_MARKER).exists()

    def required_files(self) -> list[Path]:
        files = [
            self.lm_config,
            self.tiktoken_model,
            self.tokenizer_config,
            self.whisper / "config.json",
            self.glm_tokenizer / "config.json",
        ]
        if not self.text_only:
            files += [
                self.detokenizer / "config.yaml",
                self.detokenizer / "model.pt",
                self.vocoder / "config.json",
                self.vocoder / "model.pt",
            ]
        return files


# Written by the demo checkpoint writer; its presence means "random weights, speech is noise".
DEMO_MARKER = "KIMIAUDIO_DEMO_CHECKPOINT.json"


def find_checkpoint(
    model_dir: str | Path, glm_dir: str | Path | None = None, text_only: bool = False
) -> CheckpointPaths:
    """Check that every file the loaders need exists; return their paths."""
    root = Path(model_dir).expanduser()
    if not root.is_dir():
        raise CheckpointError(f"{root}: checkpoint directory not found (expected a Kimi-Audio-7B-Instruct download)")
    glm = Path(glm_dir).expanduser() if glm_dir else root / "glm-4-voice-tokenizer"
    paths = CheckpointPaths(root=root, glm_tokenizer=glm, text_only=text_only)
    for file in paths.required_files():
        if not file.is_file():
            hint = ""
            if file.parent == glm:
                hint = " (download THUDM/glm-4-voice-tokenizer and set model.glm_tokenizer_path)"
            raise CheckpointError(f"{file}: {'a directory, not a file' if file.is_dir() else 'missing'}{hint}")
    if not (root / "model.safetensors").is_file() and not (root / "model.safetensors.index.json").is_file():
        raise CheckpointError(f"{root}: expected model.safetensors or model.safetensors.index.json with its shards")
    return paths


def resolve_device(name: str) -> torch.device:
    """model.device as the one device everything runs on: auto is cuda where CUDA is available,
    else cpu; cuda without an index is the current CUDA device, so every torch.cuda call below
    (memory figures, caps, streams) gets an indexed device (some refuse an index-less one)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise CheckpointError(f"model.device: unknown device {name!r} (expected auto, cpu, cuda or cuda:N)") from None
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise CheckpointError("model.device: cuda was asked for but no CUDA device is available")
    if device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if device.index >= torch.cuda.device_count():
        raise CheckpointError(f"model.device: {name} does not exist ({torch.cuda.device_count()} CUDA devices)")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
