"""Typed, validated configuration.

`config.toml` at the repository root documents every key; `load_config` reads such a file,
checks every key against the section dataclasses (sections.py; the ranges they share are in
ranges.py), and applies CLI overrides. Each field declares its range next to its default
(`setting`, see validation.py); an unknown key, a value of
the wrong type or out of range is a ConfigError `section.key: expected <what>, got <value>`.
A session.update (server/session/session_update.py), a chat request's sampling overrides and
SamplingParams built in code are checked against the same ranges; the rules between settings
follow the ranges (`_validate`; the detokenizer's in chunk_schedule.py).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, get_type_hints

from kimiaudio.config.chunk_schedule import MAX_POSITION, ChunkSchedule

# Re-exported: the package is where the rest of the code finds the settings and their ranges.
from kimiaudio.config.ranges import (
    CHUNK_TOKENS,
    MAX_NEW_TOKENS,
    MILLISECONDS,
    ODE_STEPS,
    OPENAI_MODEL_NAMES,
    PRESENCE_FREQUENCY_PENALTY,
    REPETITION_PENALTY,
    REPETITION_WINDOW,
    SEED,
    TEMPERATURE,
    TOP_K,
    TOP_LOGPROBS,
    TOP_P,
    WEIGHT_CHOICES,
)
from kimiaudio.config.sections import (
    AudioConfig,
    DetokConfig,
    EngineConfig,
    ModelConfig,
    SamplingConfig,
    ServerConfig,
    StorageConfig,
    VadConfig,
    VoicesConfig,
)
from kimiaudio.errors import ConfigError
from kimiaudio.validation import check_fields, check_value, declared

__all__ = [
    "CHUNK_TOKENS",
    "MAX_NEW_TOKENS",
    "MILLISECONDS",
    "ODE_STEPS",
    "OPENAI_MODEL_NAMES",
    "PRESENCE_FREQUENCY_PENALTY",
    "REPETITION_PENALTY",
    "REPETITION_WINDOW",
    "SEED",
    "TEMPERATURE",
    "TOP_K",
    "TOP_LOGPROBS",
    "TOP_P",
    "WEIGHT_CHOICES",
    "AudioConfig",
    "DetokConfig",
    "EngineConfig",
    "ModelConfig",
    "SamplingConfig",
    "ServerConfig",
    "StorageConfig",
    "VadConfig",
    "VoicesConfig",
    "Config",
    "ConfigError",
    "apply_overrides",
    "check_setting",
    "load_config",
    "served_detok",
]

log = logging.getLogger(__name__)

# Settings that no longer exist but that configs written for an earlier version still set:
# taken with a warning that says what replaced them (a start that failed on them would gain
# the user nothing).
RETIRED = {
    "engine.memory_fraction": (
        "the KV pool takes what the memory plan leaves of the device (weights, detokenizer buffers, "
        "state and graphs, activations; `python -m kimiaudio bench --memory-plan` prints it), so "
        "this setting is ignored: remove it (engine.num_kv_blocks still fixes the pool's size)"
    ),
}


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    detok: DetokConfig = field(default_factory=DetokConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    vad: VadConfig = field(default_factory=VadConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    voices: VoicesConfig = field(default_factory=VoicesConfig)
    # Directory that relative paths are resolved against (the config file's directory).
    base_dir: str = "."

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()

    @property
    def data_dir(self) -> Path:
        return self.resolve(self.storage.data_dir)


@cache
def _sections() -> dict[str, type]:
    """{section name: its dataclass}."""
    hints = get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config) if f.name != "base_dir"}


def _section(name: str) -> type:
    sections = _sections()
    if name not in sections:
        raise ConfigError(f"[{name}]: unknown section (known: {', '.join(sorted(sections))})")
    return sections[name]


def check_setting(section: str, key: str, value: Any) -> Any:
    """`value` checked (type and range) as the setting `section.key`, as a plain value."""
    fields = declared(_section(section))
    if key not in fields:
        raise ConfigError(f"{section}.{key}: unknown setting (known: {', '.join(fields)})")
    expected, bounds = fields[key]
    return check_value(f"{section}.{key}", value, expected, bounds)


def apply_overrides(config: Config, overrides: dict[str, dict], source: str = "") -> Config:
    """Apply {"section": {"key": value}} on top of `config` with the same validation (`source`:
    the file they come from, named in a retired setting's warning)."""
    for name, values in overrides.items():
        _section(name)
        if not isinstance(values, dict):
            raise ConfigError(f"[{name}]: expected a table of settings, got {values!r}")
        for key, value in values.items():
            if f"{name}.{key}" in RETIRED:
                log.warning("%s%s.%s: %s", f"{source}: " if source else "", name, key, RETIRED[f"{name}.{key}"])
                continue
            setattr(getattr(config, name), key, check_setting(name, key, value))
    _validate(config)
    return config


def _validate(config: Config) -> None:
    """Every setting in its declared range, then the rules that tie settings together."""
    for name in _sections():
        check_fields(getattr(config, name), f"{name}.")
    # The chunk schedule's own rules (e.g. a first chunk longer than its look-ahead), within the
    # official DiT position limit; a checkpoint allowing fewer positions is checked at its load.
    ChunkSchedule.from_config(config.detok, MAX_POSITION)
    for entry in config.server.trusted_proxies:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ConfigError(
                f"server.trusted_proxies: expected IP addresses or networks (like 10.0.0.0/8), got {entry!r}"
            ) from None
    if config.voices.min_seconds > config.voices.max_seconds:
        raise ConfigError(
            f"voices.min_seconds = {config.voices.min_seconds}: expected at most voices.max_seconds "
            f"({config.voices.max_seconds})"
        )


def load_config(path: str | Path | None = None, overrides: dict[str, dict] | None = None) -> Config:
    """Read `path` (a TOML file; None = built-in defaults) and apply `overrides`."""
    config = Config()
    if path is not None:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # (an editor's byte order mark too)
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except OSError as exc:  # a directory, no permission
            raise ConfigError(f"{path}: config file cannot be read ({exc.strerror or exc})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})") from None
        config.base_dir = str(path.resolve().parent)
        try:
            apply_overrides(config, data, str(path))
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    return apply_overrides(config, overrides or {})


def served_detok(config: Config) -> DetokConfig:
    """The [detok] settings a detokenizer serving `config` is built with: it batches at most
    server.max_sessions streams (no bigger batch can form), so its buckets and static buffers
    stop there. The served stack, the random stack and the memory plan all build it so."""
    rows = min(config.detok.max_batch_sessions, config.server.max_sessions)
    return dataclasses.replace(config.detok, max_batch_sessions=rows)
