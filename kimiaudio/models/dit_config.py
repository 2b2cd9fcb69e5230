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

from kimiaudio.checkpoint.files import config_value, read_yaml
from kimiaudio.errors import CheckpointError

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

        def get(key, kind, default=...):
            value = config_value(dit, key, path, default)
            accepted = (int, float) if kind is float else kind
            if (
                isinstance(value, bool) != (kind is bool)
                or not isinstance(value, accepted)
                or (kind is int and value <= 0)
            ):
                raise CheckpointError(
                    f"{path}: 'model.dit.{key}' = {value!r}, expected a {'positive ' * (kind is int)}{kind.__name__}"
                )
            return kind(value)

        ffn = config_value(dit, "ffn_type", path, "conv1d_conv1d")  # official default
        if ffn != "vanilla_mlp":
            raise CheckpointError(f"{path}: 'model.dit.ffn_type' = {ffn!r}, only 'vanilla_mlp' is supported")
        kind = config_value(dit, "position_embedding_type", path)
        if kind not in POSITION_EMBEDDINGS:
            raise CheckpointError(
                f"{path}: 'model.dit.position_embedding_type' = {kind!r}, expected one of {POSITION_EMBEDDINGS}"
            )
        rope = config_value(dit, "rope_params", path, {})
        if not isinstance(rope, dict):
            raise CheckpointError(f"{path}: 'model.dit.rope_params' must be a mapping")
        normalize = config_value(raw, "normalize_mel", path)
        mean, std = config_value(raw, "mel_mean", path, None), config_value(raw, "mel_std", path, None)
        if normalize and not all(isinstance(v, (int, float)) for v in (mean, std)):
            raise CheckpointError(f"{path}: normalize_mel is true but mel_mean/mel_std are not numbers")
        cfg = cls(
            input_size=get("input_size", int),
            semantic_vocab_size=get("semantic_vocab_size", int),
            hidden_size=get("hidden_size", int),
            depth=get("depth", int),
            num_heads=get("num_heads", int),
            mlp_ratio=get("mlp_ratio", float, 4.0),
            use_rope=get("use_rope", bool, False),
            rope_max_positions=int(rope.get("max_position_embeddings", 4096)),
            rope_base=float(rope.get("rope_base", 10000.0)),
            rope_interpolation_factor=float(rope.get("rope_interpolation_factor", 1.0)),
            position_embedding_type=kind,
            max_seq_len=get("max_seq_len", int),
            normalize_mel=bool(normalize),
            mel_mean=float(mean) if normalize else None,
            mel_std=float(std) if normalize else None,
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
