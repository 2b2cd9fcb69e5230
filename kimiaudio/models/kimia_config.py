"""The Kimi-Audio LM's config.json, read into a typed dataclass.

Follows the official `KimiAudioConfig` (configuration_moonshot_kimia.py): every key the LM
uses is read from the checkpoint's config.json; keys the official class gives a default for
(rope_theta, kimia_mimo_audiodelaytokens, media ids, use_whisper_feature) keep that default
when absent. A missing or mistyped key is a CheckpointError naming the file and the key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimiaudio.checkpoint.files import config_value, read_json
from kimiaudio.errors import CheckpointError


@dataclass(frozen=True)
class KimiaConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    kimia_mimo_layers: int
    kimia_mimo_transformer_from_layer_index: int
    kimia_token_offset: int
    kimia_adaptor_input_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    kimia_mimo_audiodelaytokens: int = 6
    kimia_media_begin: int = 151661
    kimia_media_end: int = 151663
    use_whisper_feature: bool = True
    hidden_act: str = "silu"
    source: str = "config.json"  # the file it was read from, for error messages

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_kv_layers(self) -> int:
        """Attention layers that keep a KV cache: trunk layers, then MIMO layers."""
        return self.num_hidden_layers + self.kimia_mimo_layers

    @classmethod
    def from_file(cls, path: str | Path) -> "KimiaConfig":
        path = Path(path)
        return cls.from_dict(read_json(path), path)

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str | Path = "config.json") -> "KimiaConfig":
        path = Path(path)
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            if field.name == "source":
                continue
            default = ... if field.default is dataclasses.MISSING else field.default
            value = config_value(data, field.name, path, default)
            values[field.name] = _check_type(value, field.type, field.name, path)
        config = cls(**values, source=str(path))
        config._validate(path)
        return config

    def _validate(self, path: Path) -> None:
        def bad(message: str) -> CheckpointError:
            return CheckpointError(f"{path}: {message}")

        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "vocab_size", "kimia_adaptor_input_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise bad(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise bad(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise bad(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                      f"num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 2:
            raise bad(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if self.kimia_mimo_layers < 0 or self.kimia_mimo_audiodelaytokens < 0:
            raise bad("kimia_mimo_layers and kimia_mimo_audiodelaytokens must be >= 0")
        if not 0 <= self.kimia_mimo_transformer_from_layer_index < self.num_hidden_layers:
            raise bad(f"kimia_mimo_transformer_from_layer_index {self.kimia_mimo_transformer_from_layer_index} "
                      f"must be in 0..{self.num_hidden_layers - 1}")
        if not 0 < self.kimia_token_offset <= self.vocab_size:
            raise bad(f"kimia_token_offset {self.kimia_token_offset} must be in 1..vocab_size ({self.vocab_size})")
        if self.hidden_act != "silu":
            raise bad(f"hidden_act {self.hidden_act!r} is not supported (expected 'silu')")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise bad("rms_norm_eps and rope_theta must be positive")


def _check_type(value: Any, annotation: Any, name: str, path: Path) -> Any:
    kind = {"int": int, "float": float, "bool": bool, "str": str}[annotation if isinstance(annotation, str) else annotation.__name__]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is not bool and isinstance(value, bool) or not isinstance(value, kind):
        raise CheckpointError(f"{path}: key {name!r} must be of type {kind.__name__}, got {value!r}")
    return value
