"""The detokenizer DiT's configuration (`audio_detokenizer/config.yaml`) and position tables.

Follows the official loader (kimia_infer/models/detokenizer/__init__.py reads `model.dit.*`,
`normalize_mel`, `mel_mean`, `mel_std`) and the official tables: complex RoPE by absolute
position (flow_matching/model.py) and fairseq's sinusoidal embedding (row 0 = padding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from kimiaudio.checkpoint.files import POSITIVE_INT, POSITIVE_NUMBER, checked_value, config_value, read_yaml
from kimiaudio.errors import CheckpointError
from kimiaudio.validation import NO_BOUNDS, Bounds

POSITION_EMBEDDINGS = ("skip", "sincos", "learnable")


@dataclass(frozen=True)
class DiTConfig:
    """The keys of audio_detokenizer/config.yaml that the official loader reads."""

    input_size: int  # mel bins
    semantic_vocab_size: int  # codebook size; the embedding has one more (CFG null) row
    hidden_size: int
    depth: int
    num_heads: int
    mlp_ratio: float
    use_rope: bool
    rope_max_positions: int
    rope_base: float
    rope_interpolation_factor: float
    position_embedding_type: str
    max_seq_len: int
    normalize_mel: bool
    mel_mean: float | None
    mel_std: float | None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def mel_stats(self) -> tuple[float, float] | None:
        """(mel_mean, mel_std) when the model works on normalised mels, else None."""
        if not self.normalize_mel or self.mel_mean is None or self.mel_std is None:
            return None
        return self.mel_mean, self.mel_std

    @classmethod
    def from_yaml(cls, path: Path) -> DiTConfig:
        raw = read_yaml(path)
        dit = config_value(raw, "model", path)
        dit = config_value(dit, "dit", path) if isinstance(dit, dict) else None
        if not isinstance(dit, dict):
            raise CheckpointError(f"{path}: expected a mapping under 'model.dit'")

        def get(key, kind, bounds=NO_BOUNDS, default=...):
            return checked_value(dit, key, path, kind, bounds, default, where="model.dit.")

        def size(key, default=...):
            return get(key, int, POSITIVE_INT, default)

        # The only feed-forward supported; left out, it is the official default conv1d_conv1d.
        get("ffn_type", str, Bounds(choices=("vanilla_mlp",)), "conv1d_conv1d")
        rope = get("rope_params", dict, default={})

        def rope_value(key, bounds, default):
            return checked_value(rope, key, path, type(default), bounds, default, where="model.dit.rope_params.")

        normalize = checked_value(raw, "normalize_mel", path, bool)
        # Only a normalising model reads them: (mel - mean) / std on the way in, undone on the way out.
        mean = checked_value(raw, "mel_mean", path, float) if normalize else None
        std = checked_value(raw, "mel_std", path, float, POSITIVE_NUMBER) if normalize else None
        cfg = cls(
            input_size=size("input_size"),
            semantic_vocab_size=size("semantic_vocab_size"),
            hidden_size=size("hidden_size"),
            depth=size("depth"),
            num_heads=size("num_heads"),
            mlp_ratio=get("mlp_ratio", float, POSITIVE_NUMBER, 4.0),
            use_rope=get("use_rope", bool, default=False),
            rope_max_positions=rope_value("max_position_embeddings", POSITIVE_INT, 4096),
            rope_base=rope_value("rope_base", POSITIVE_NUMBER, 10000.0),
            rope_interpolation_factor=rope_value("rope_interpolation_factor", POSITIVE_NUMBER, 1.0),
            position_embedding_type=get("position_embedding_type", str, Bounds(choices=POSITION_EMBEDDINGS)),
            max_seq_len=size("max_seq_len"),
            normalize_mel=normalize,
            mel_mean=mean,
            mel_std=std,
        )
        if cfg.hidden_size % cfg.num_heads or cfg.head_dim % 2:
            raise CheckpointError(
                f"{path}: hidden_size {cfg.hidden_size} must split into {cfg.num_heads} heads of even size"
            )
        return cfg


def rope_table(cfg: DiTConfig) -> Tensor:
    """complex64 [rows, head_dim/2]: polar(1, pos/interp * base^(-2i/head_dim)) (official table)."""
    dim = cfg.head_dim
    # on the CPU whatever the default device (a model built on "meta" still gets real tables)
    inv = 1.0 / (cfg.rope_base ** (torch.arange(0, dim, 2, device="cpu")[: dim // 2].float() / dim))
    pos = torch.arange(cfg.rope_max_positions, device="cpu").float() * (1.0 / float(cfg.rope_interpolation_factor))
    freqs = torch.outer(pos, inv).float()
    table = torch.polar(torch.ones_like(freqs), freqs)
    return table[: cfg.max_seq_len] if cfg.max_seq_len < cfg.rope_max_positions else table


def sincos_table(rows: int, dim: int) -> Tensor:
    """fp32 [rows, dim] fairseq sinusoidal table ([sin | cos], row 0 = padding = zeros)."""
    half = dim // 2
    scale = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.float, device="cpu") * -scale)
    args = torch.arange(rows, dtype=torch.float, device="cpu").unsqueeze(1) * freqs.unsqueeze(0)
    table = torch.cat([torch.sin(args), torch.cos(args)], dim=1).view(rows, -1)
    if dim % 2 == 1:
        table = torch.cat([table, torch.zeros(rows, 1, device="cpu")], dim=1)
    table[0, :] = 0
    return table
