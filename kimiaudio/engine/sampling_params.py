"""Sampling parameters of a request (text and audio stream) and its own random stream.

The settings follow the official KimiASampler (temperature, top-k, repetition penalty over a
window; see layers/sampler.py for how they are applied). The official code draws with
torch.multinomial on the CUDA RNG, which cannot be reproduced; here every request owns a CPU
generator (`RequestRandom`) that yields one uniform per stream and step, so a request's tokens
depend on its seed alone, however it is batched. No torch tensors cross into the sampler from
here but the uniforms.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from kimiaudio.config import SEED, TOP_LOGPROBS, SamplingConfig
from kimiaudio.layers.stream_sampling import StreamSampling
from kimiaudio.validation import check_fields, check_value, setting

# The defaults are config [sampling]'s, written once there (and documented in config.toml).
_DEFAULTS = SamplingConfig()


@dataclass(frozen=True)
class SamplingParams:
    text_temperature: float = _DEFAULTS.text_temperature
    text_top_k: int = _DEFAULTS.text_top_k
    text_repetition_penalty: float = _DEFAULTS.text_repetition_penalty
    text_repetition_window: int = _DEFAULTS.text_repetition_window
    audio_temperature: float = _DEFAULTS.audio_temperature
    audio_top_k: int = _DEFAULTS.audio_top_k
    audio_repetition_penalty: float = _DEFAULTS.audio_repetition_penalty
    audio_repetition_window: int = _DEFAULTS.audio_repetition_window
    text_top_p: float = _DEFAULTS.text_top_p
    audio_top_p: float = _DEFAULTS.audio_top_p
    text_presence_penalty: float = _DEFAULTS.text_presence_penalty
    text_frequency_penalty: float = _DEFAULTS.text_frequency_penalty
    # How many of the likeliest alternatives to report with each text token (OpenAI's
    # top_logprobs; its range). The sampled token's own log-probability is always reported.
    text_top_logprobs: int = setting(0, TOP_LOGPROBS)
    seed: int | None = None  # None = a fresh random seed (config [sampling] seed is a server's fixed one)
    max_new_tokens: int = _DEFAULTS.max_new_tokens  # 0 = the official limit for the output type
    # Not official: generate exactly the length limit, past the stop tokens (as vLLM's
    # ignore_eos). For fixed-length benchmark turns; the tokens after a stop mean nothing.
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        # The ranges of config [sampling], whose keys these are: a request built in code is
        # held to them as a config file is.
        check_fields(self, "sampling.", like=SamplingConfig)

    # Cached: the engine reads both for every sequence at every step, and building one checks
    # its fields again.
    @cached_property
    def text(self) -> StreamSampling:
        return StreamSampling(
            self.text_temperature,
            self.text_top_k,
            self.text_repetition_penalty,
            self.text_repetition_window,
            self.text_top_p,
            self.text_presence_penalty,
            self.text_frequency_penalty,
        )

    @cached_property
    def audio(self) -> StreamSampling:
        return StreamSampling(
            self.audio_temperature,
            self.audio_top_k,
            self.audio_repetition_penalty,
            self.audio_repetition_window,
            self.audio_top_p,
        )

    @classmethod
    def from_config(cls, sampling: Any, **overrides: Any) -> SamplingParams:
        """From a `config.SamplingConfig` (same field names), with optional overrides."""
        names = cls.__dataclass_fields__
        values = {name: getattr(sampling, name) for name in names if hasattr(sampling, name)}
        values.update(overrides)
        return cls(**values)

    @classmethod
    def greedy(cls, **overrides: Any) -> SamplingParams:
        """Both temperatures 0 (argmax; top-k then plays no part), as the official `generate()`
        defaults; the rest as configured by default."""
        return cls(**{"text_temperature": 0.0, "audio_temperature": 0.0, **overrides})


class RequestRandom:
    """A request's own CPU generator: one (text, audio) pair of uniforms in [0, 1) per step.

    Pairs are drawn `BLOCK` at a time: one torch call per 64 steps instead of one per step
    and request (which cost the engine a few microseconds per sequence per step). The stream
    is a function of the seed alone, however it is consumed."""

    BLOCK = 64

    def __init__(self, seed: int | None = None):
        self.generator = torch.Generator(device="cpu")
        if seed is None:
            self.seed = self.generator.seed()
        else:
            # Checked here too: an out-of-range seed from code would otherwise surface as
            # torch's "Overflow when unpacking long long" inside the worker.
            self.seed = check_value("seed", seed, int, SEED)
            self.generator.manual_seed(self.seed)
        self._pairs: list[tuple[float, float]] = []

    def next_uniforms(self) -> tuple[float, float]:
        """(text uniform, audio uniform) of the next step."""
        if not self._pairs:
            block = torch.rand(self.BLOCK, 2, generator=self.generator).tolist()
            self._pairs = [tuple(pair) for pair in reversed(block)]  # pop() from the end = in order
        return self._pairs.pop()
