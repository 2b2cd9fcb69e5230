"""The detokenizer's chunk schedule: tokens, look-ahead and ODE steps of every chunk (no torch).

A stream's first chunk and its later chunks have their own settings ([detok] in config.toml,
`DetokConfig`): the first chunk decides when the first audio can play, the later ones how much
work each second of speech costs. `preset = "official"` replaces them all with the official
streaming of KimiAudio.detokenize_audio (30-token chunks, 12 look-ahead tokens, 30 ODE steps,
no guard), so the exact official behaviour is one setting away. Each setting's own range is
declared on DetokConfig; the rules that tie settings together are checked here, each once, with
a ConfigError that names the key.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from kimiaudio.errors import ConfigError
from kimiaudio.validation import check_fields

UPSAMPLE = 4  # mel frames per semantic token (official upsample_factor)
MAX_POSITION = 4096  # official max_pos_size of the DiT positions
# What preset = "official" sets (official PrefixStreamingFlowMatchingDetokenizer as
# KimiAudio.detokenize_audio drives it); the guard cannot lower steps below ode_steps then.
OFFICIAL: dict[str, Any] = dict(
    first_chunk_tokens=30,
    first_look_ahead_tokens=12,
    first_ode_steps=30,
    chunk_tokens=30,
    chunk_growth=1.0,
    max_chunk_tokens=30,
    look_ahead_tokens=12,
    ode_steps=30,
    min_ode_steps=30,
    lower_first_chunk=False,
    max_kv_cache_frames=900,
)


@dataclass(frozen=True)
class ChunkSchedule:
    first_chunk_tokens: int
    first_look_ahead_tokens: int
    first_ode_steps: int  # points of linspace(0, 1, steps): steps - 1 Euler calls
    chunk_tokens: int  # the second chunk; each later one grows by chunk_growth ...
    chunk_growth: float
    max_chunk_tokens: int  # ... up to this
    look_ahead_tokens: int
    ode_steps: int
    min_ode_steps: int  # the guard's floor for later chunks
    lower_first_chunk: bool  # may the guard lower a first chunk's steps too
    max_kv_cache_frames: int

    def tokens(self, index: int) -> int:
        """Tokens of chunk `index` (0 = first) of a stream, grown as the stream grows them."""
        if index == 0:
            return self.first_chunk_tokens
        size = float(self.chunk_tokens)
        for _ in range(index - 1):  # the official code multiplies step by step: same rounding
            size *= self.chunk_growth
        return max(1, min(self.max_chunk_tokens, int(size)))

    def look_ahead(self, index: int) -> int:
        """Look-ahead tokens of chunk `index` when it is not the final one."""
        return self.first_look_ahead_tokens if index == 0 else self.look_ahead_tokens

    def steps(self, index: int) -> int:
        return self.first_ode_steps if index == 0 else self.ode_steps

    def frames(self, index: int) -> int:
        """DiT frames of chunk `index`: its tokens x4 plus the look-ahead frames carried in."""
        carried = 0 if index == 0 else self.look_ahead(index - 1)
        return UPSAMPLE * (carried + self.tokens(index))

    def num_growing_chunks(self) -> int:
        """Chunks until the size stops changing (the indices after it repeat the last shape)."""
        index = 1
        while index < 64 and self.tokens(index + 1) != self.tokens(index):
            index += 1
        return index + 1

    @classmethod
    def from_config(cls, cfg, max_position: int) -> ChunkSchedule:
        """The schedule a DetokConfig asks for (preset applied): every [detok] setting in its
        declared range (a DetokConfig built in code is held to them as a file is), then the
        rules between them, within the DiT's position limit."""
        check_fields(cfg, "detok.")
        if cfg.preset == "official":
            return _checked(cls(**OFFICIAL), max_position)
        values = {f.name: getattr(cfg, f.name) for f in fields(cls) if f.name != "lower_first_chunk"}
        return _checked(cls(**values, lower_first_chunk=cfg.guard_lowers_first_chunk), max_position)


def _checked(s: ChunkSchedule, max_position: int) -> ChunkSchedule:
    """The cross-field rules; the single-setting ranges are DetokConfig's."""

    def bad(key: str, expected: str) -> ConfigError:
        return ConfigError(f"detok.{key} = {getattr(s, key)!r}: expected {expected}")

    if s.min_ode_steps > s.ode_steps:
        raise bad("min_ode_steps", f"at most ode_steps ({s.ode_steps}): the guard only lowers steps")
    if s.first_chunk_tokens <= s.first_look_ahead_tokens:
        raise bad(
            "first_chunk_tokens",
            f"more than first_look_ahead_tokens ({s.first_look_ahead_tokens}): a first chunk must keep some frames",
        )
    if s.first_look_ahead_tokens + s.chunk_tokens <= s.look_ahead_tokens:
        raise bad(
            "chunk_tokens",
            f"more than look_ahead_tokens - first_look_ahead_tokens "
            f"({s.look_ahead_tokens - s.first_look_ahead_tokens}): the second chunk must keep some frames",
        )
    if s.max_chunk_tokens < s.chunk_tokens:
        raise bad("max_chunk_tokens", f">= chunk_tokens ({s.chunk_tokens})")
    biggest = max(s.frames(i) for i in range(s.num_growing_chunks() + 1))
    if biggest > max_position:
        raise bad("max_chunk_tokens", f"chunks of at most {max_position} frames with their look-ahead (got {biggest})")
    return s
