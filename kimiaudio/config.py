"""Typed, validated configuration.

`config.toml` at the repository root documents every key; `load_config` reads such a file,
checks every key and type against the dataclasses below, and applies CLI overrides. An
unknown key or a value of the wrong type is a ConfigError naming `section.key`.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from kimiaudio.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


@dataclass
class ModelConfig:
    # Kimi-Audio-7B-Instruct directory; empty = the embedded demo checkpoint under data_dir.
    path: str = ""
    # THUDM/glm-4-voice-tokenizer directory; empty = `<path>/glm-4-voice-tokenizer`.
    glm_tokenizer_path: str = ""
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bf16 on GPU, float32 on CPU) | float32 | bfloat16 | float16
    text_only: bool = False  # skip the detokenizer and vocoder entirely


@dataclass
class SamplingConfig:
    # Defaults of the official infer.py / README.
    text_temperature: float = 0.0
    text_top_k: int = 5
    text_repetition_penalty: float = 1.0
    text_repetition_window: int = 16
    audio_temperature: float = 0.8
    audio_top_k: int = 10
    audio_repetition_penalty: float = 1.0
    audio_repetition_window: int = 64
    # 0 = the official limits: 1500 positions in all for speech out, 7500 for text out.
    max_new_tokens: int = 0
    seed: int = 0


@dataclass
class AudioConfig:
    max_input_seconds: float = 120.0  # longer user audio is refused with a clear error
    # Audio whose peak stays below this (full scale = 1.0) counts as silence and is refused.
    silence_peak: float = 1e-3
    # Most utterances the speech encoders take in one batch while answers are being generated:
    # each fills a 30 s Whisper window, and every running answer waits for the whole batch.
    encode_batch_size: int = 4


@dataclass
class DetokConfig:
    first_chunk_tokens: int = 30  # official: 30; smaller gives lower first-audio latency
    chunk_tokens: int = 30
    chunk_growth: float = 1.0  # each later chunk is this many times the previous (capped)
    max_chunk_tokens: int = 60
    look_ahead_tokens: int = 12
    ode_steps: int = 30
    max_kv_cache_frames: int = 900
    # Most sessions whose chunks run in one worker iteration, most urgent first (see
    # pipeline_turn.chunks_to_run); the rest wait one LLM step instead of stalling it.
    max_batch_sessions: int = 8
    # While the LLM has work, a session's next chunk waits until less than this much of its
    # audio is left to play (a reply still waiting for its first audio never waits).
    run_ahead_s: float = 0.5


@dataclass
class EngineConfig:
    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int = 0  # 0 = size the pool from memory_fraction
    memory_fraction: float = 0.85  # of free device memory (or, on CPU, a 2 GiB budget)
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 8192
    # torch intra-op threads of the GPU worker thread when the model runs on the CPU (0 = torch's
    # default). On the 2-core demo machine, 2 sped up the LM alone (bench: 6.1-6.6x the reference
    # loop at 16 sessions against about 5x) but halved the whole pipeline, whose event loop needs
    # the other core (0.53-0.58x of the offline path against about 1.05x).
    cpu_threads: int = 1


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    max_sessions: int = 16
    ice_servers: list = field(default_factory=list)  # e.g. ["stun:stun.l.google.com:19302"]
    # Required by every route but the demo page (Authorization: Bearer KEY); empty = no key.
    # The environment variable KIMIAUDIO_API_KEY, when set, takes precedence (keeps it out of files).
    api_key: str = ""
    # Host header values served (a DNS-rebinding page sends its own name); empty = the bound
    # host, localhost, 127.0.0.1 and [::1]; "*" = any (behind a proxy that checks it).
    allowed_hosts: list = field(default_factory=list)
    # Origins (scheme://host:port) allowed to POST, DELETE or open a WebSocket besides the
    # server's own page; requests without an Origin header (non-browser clients) pass.
    allowed_origins: list = field(default_factory=list)
    # Largest request body (25 MB, OpenAI's upload limit), and how long it may take to arrive.
    max_body_bytes: int = 25 * 1024 * 1024
    body_timeout_s: float = 30.0
    # On SIGTERM/SIGINT: answers in flight may finish for this long before sessions are closed.
    shutdown_grace_s: float = 10.0


@dataclass
class VadConfig:
    threshold: float = 0.5
    min_speech_ms: int = 250
    silence_ms: int = 500  # end-of-speech silence that commits the turn
    prefix_padding_ms: int = 300
    barge_in: bool = True


@dataclass
class StorageConfig:
    data_dir: str = "data"  # relative paths are relative to the config file's directory
    database: str = "kimiaudio.db"  # inside data_dir


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
    # Directory that relative paths are resolved against (the config file's directory).
    base_dir: str = "."

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()

    @property
    def data_dir(self) -> Path:
        return self.resolve(self.storage.data_dir)


def _check_value(where: str, value: Any, expected: type) -> Any:
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is bool and not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if expected in (int, float) and (isinstance(value, bool) or not isinstance(value, expected)):
        raise ConfigError(f"{where}: expected a number ({expected.__name__}), got {value!r}")
    if expected in (str, list) and not isinstance(value, expected):
        raise ConfigError(f"{where}: expected a {expected.__name__}, got {value!r}")
    return value


def _apply_section(section: Any, name: str, values: dict) -> None:
    if not isinstance(values, dict):
        raise ConfigError(f"[{name}]: expected a table of settings, got {values!r}")
    hints = get_type_hints(type(section))
    for key, value in values.items():
        if key not in hints:
            known = ", ".join(hints)
            raise ConfigError(f"{name}.{key}: unknown setting (known: {known})")
        setattr(section, key, _check_value(f"{name}.{key}", value, hints[key]))


def apply_overrides(config: Config, overrides: dict[str, dict]) -> Config:
    """Apply {"section": {"key": value}} on top of `config` with the same validation."""
    sections = {f.name for f in dataclasses.fields(Config) if f.name != "base_dir"}
    for name, values in overrides.items():
        if name not in sections:
            raise ConfigError(f"[{name}]: unknown section (known: {', '.join(sorted(sections))})")
        _apply_section(getattr(config, name), name, values)
    _validate(config)
    return config


def _validate(config: Config) -> None:
    positive = {
        "detok.first_chunk_tokens": config.detok.first_chunk_tokens,
        "detok.chunk_tokens": config.detok.chunk_tokens,
        "detok.ode_steps": config.detok.ode_steps - 1,
        "detok.max_batch_sessions": config.detok.max_batch_sessions,
        "engine.block_size": config.engine.block_size,
        "engine.max_num_seqs": config.engine.max_num_seqs,
        "engine.max_num_batched_tokens": config.engine.max_num_batched_tokens,
        "server.max_sessions": config.server.max_sessions,
        "server.max_body_bytes": config.server.max_body_bytes,
        "server.body_timeout_s": config.server.body_timeout_s,
        "audio.max_input_seconds": config.audio.max_input_seconds,
        "audio.encode_batch_size": config.audio.encode_batch_size,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key}: must be positive (detok.ode_steps at least 2)")
    if config.model.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ConfigError(f"model.dtype: expected auto, float32, bfloat16 or float16, got {config.model.dtype!r}")
    if not config.detok.run_ahead_s >= 0:
        raise ConfigError("detok.run_ahead_s: expected seconds >= 0")
    if config.engine.cpu_threads < 0:
        raise ConfigError("engine.cpu_threads: expected 0 (torch's default) or a positive thread count")
    if not (0.0 < config.engine.memory_fraction <= 1.0):
        raise ConfigError("engine.memory_fraction: expected a value in (0, 1]")
    if not config.server.shutdown_grace_s >= 0:
        raise ConfigError("server.shutdown_grace_s: expected seconds >= 0")
    for key in ("allowed_hosts", "allowed_origins", "ice_servers"):
        if not all(isinstance(item, str) and item for item in getattr(config.server, key)):
            raise ConfigError(f"server.{key}: expected a list of non-empty strings")
    if not (0.0 < config.vad.threshold < 1.0):
        raise ConfigError("vad.threshold: expected a value in (0, 1)")


def load_config(path: str | Path | None = None, overrides: dict[str, dict] | None = None) -> Config:
    """Read `path` (a TOML file; None = built-in defaults) and apply `overrides`."""
    config = Config()
    if path is not None:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})") from None
        config.base_dir = str(path.resolve().parent)
        try:
            apply_overrides(config, data)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    return apply_overrides(config, overrides or {})
