"""The Kimi-Audio LM's config.json, read into a typed dataclass.

Follows the official `KimiAudioConfig` (configuration_moonshot_kimia.py): every key the LM
uses is read from the checkpoint's config.json; keys the official class gives a default for
(rope_theta, kimia_mimo_audiodelaytokens, media ids, use_whisper_feature) keep that default
when absent. Each key's range is declared on its field (validation.py); a missing, mistyped or
out-of-range key is a CheckpointError naming the file and the key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimiaudio.checkpoint.files import INT32_MAX, POSITIVE_INT, POSITIVE_NUMBER, checked_value, read_json
from kimiaudio.errors import CheckpointError
from kimiaudio.validation import Bounds, declared, setting

COUNT = Bounds(0, INT32_MAX)


@dataclass(frozen=True)
class KimiaConfig:
    hidden_size: int = setting(bounds=POSITIVE_INT)
    intermediate_size: int = setting(bounds=POSITIVE_INT)
    num_hidden_layers: int = setting(bounds=POSITIVE_INT)
    num_attention_heads: int = setting(bounds=POSITIVE_INT)
    num_key_value_heads: int = setting(bounds=POSITIVE_INT)
    vocab_size: int = setting(bounds=POSITIVE_INT)
    kimia_mimo_layers: int = setting(bounds=COUNT)
    kimia_mimo_transformer_from_layer_index: int = setting(bounds=COUNT)  # and < num_hidden_layers
    kimia_token_offset: int = setting(bounds=POSITIVE_INT)  # and <= vocab_size
    kimia_adaptor_input_dim: int = setting(bounds=POSITIVE_INT)
    rms_norm_eps: float = setting(1e-6, POSITIVE_NUMBER)
    rope_theta: float = setting(10000.0, POSITIVE_NUMBER)
    max_position_embeddings: int = setting(8192, POSITIVE_INT)
    kimia_mimo_audiodelaytokens: int = setting(6, COUNT)
    kimia_media_begin: int = 151661
    kimia_media_end: int = 151663
    use_whisper_feature: bool = True
    hidden_act: str = setting("silu", Bounds(choices=("silu",)))  # the only activation supported
    source: str = "config.json"  # the file it was read from, for error messages

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_kv_layers(self) -> int:
        """Attention layers that keep a KV cache: trunk layers, then MIMO layers."""
        return self.num_hidden_layers + self.kimia_mimo_layers

    @classmethod
    def from_file(cls, path: str | Path) -> KimiaConfig:
        path = Path(path)
        return cls.from_dict(read_json(path), path)

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str | Path = "config.json") -> KimiaConfig:
        path = Path(path)
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            if field.name == "source":
                continue
            default = ... if field.default is dataclasses.MISSING else field.default
            expected, bounds = declared(cls)[field.name]
            values[field.name] = checked_value(data, field.name, path, expected, bounds, default)
        config = cls(**values, source=str(path))
        config._validate(path)
        return config

    def _validate(self, path: Path) -> None:
        """The rules between keys; each key's own range is declared on its field."""

        def bad(message: str) -> CheckpointError:
            return CheckpointError(f"{path}: {message}")

        if self.hidden_size % self.num_attention_heads:
            raise bad(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise bad(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise bad(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if self.kimia_mimo_transformer_from_layer_index >= self.num_hidden_layers:
            raise bad(
                f"kimia_mimo_transformer_from_layer_index {self.kimia_mimo_transformer_from_layer_index} "
                f"must be in 0..{self.num_hidden_layers - 1}"
            )
        if self.kimia_token_offset > self.vocab_size:
            raise bad(f"kimia_token_offset {self.kimia_token_offset} must be in 1..vocab_size ({self.vocab_size})")
