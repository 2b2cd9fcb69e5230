"""Token sampling: per-request parameters, per-request RNG, and one batched sampler.

Follows the official KimiASampler (kimia_infer/utils/sampler.py), applied to the text and the
audio stream alike:
1. repetition penalty, only if penalty > 1 and the stream's history (tokens fed back so far
   in this generation) is longer than the window: the last `window` tokens' logits become
   s * p where s < 0, else s / p (a token repeated in the window is penalised once);
2. logprobs = log_softmax(logits) in fp32;
3. temperature > 1e-6: logprobs / T, probs = exp(.) over the top-k (top_k > 0) or the whole
   vocabulary (top_k = 0), not renormalised; otherwise greedy argmax (first max).
The official code draws with torch.multinomial on the CUDA RNG, which cannot be reproduced;
here every request owns a CPU generator (`RequestRandom`) that yields one uniform per stream
and step, and the token is picked by inverse CDF (first index whose cumulative weight exceeds
u * total). A row's result depends only on its own logits, params, history and uniform, so
batching never changes it. No host-device synchronisation inside `sample_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import torch

from kimiaudio.errors import ConfigError

GREEDY_TEMPERATURE = 1e-6  # official: temperatures at or below this are greedy


@dataclass(frozen=True)
class StreamSampling:
    """Sampling settings of one stream (text or audio)."""

    temperature: float = 0.0
    top_k: int = 5
    repetition_penalty: float = 1.0
    repetition_window: int = 16

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 = whole vocabulary), got {self.top_k}")
        if not self.repetition_penalty > 0:
            raise ConfigError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.repetition_window < 1:
            raise ConfigError(f"repetition_window must be >= 1, got {self.repetition_window}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= GREEDY_TEMPERATURE

    def penalises(self, history_len: int) -> bool:
        return self.repetition_penalty > 1.0 and history_len > self.repetition_window


@dataclass(frozen=True)
class SamplingParams:
    text_temperature: float = 0.0
    text_top_k: int = 5
    text_repetition_penalty: float = 1.0
    text_repetition_window: int = 16
    audio_temperature: float = 0.8
    audio_top_k: int = 10
    audio_repetition_penalty: float = 1.0
    audio_repetition_window: int = 64
    seed: int | None = None
    max_new_tokens: int = 0  # 0 = the official limit for the output type
    # Not official: generate exactly the length limit, past the stop tokens (as vLLM's
    # ignore_eos). For fixed-length benchmark turns; the tokens after a stop mean nothing.
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        _ = self.text, self.audio  # validates both streams
        if self.max_new_tokens < 0:
            raise ConfigError(f"max_new_tokens must be >= 0 (0 = official limit), got {self.max_new_tokens}")

    # Cached: the engine reads both for every sequence at every step (building and validating
    # one takes about 0.5 us: 16 us of a 2.7 ms CPU step at 16 sequences).
    @cached_property
    def text(self) -> StreamSampling:
        return StreamSampling(self.text_temperature, self.text_top_k, self.text_repetition_penalty,
                              self.text_repetition_window)

    @cached_property
    def audio(self) -> StreamSampling:
        return StreamSampling(self.audio_temperature, self.audio_top_k, self.audio_repetition_penalty,
                              self.audio_repetition_window)

    @classmethod
    def from_config(cls, sampling: Any, **overrides: Any) -> "SamplingParams":
        """From a `config.SamplingConfig` (same field names), with optional overrides."""
        names = cls.__dataclass_fields__
        values = {name: getattr(sampling, name) for name in names if hasattr(sampling, name)}
        values.update(overrides)
        return cls(**values)

    @classmethod
    def greedy(cls, **overrides: Any) -> "SamplingParams":
        """All temperatures 0: the official `generate()` defaults (top_k 5, windows 64/16)."""
        values = dict(text_temperature=0.0, audio_temperature=0.0, audio_top_k=5)
        values.update(overrides)
        return cls(**values)


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
            self.seed = int(seed)
            self.generator.manual_seed(self.seed)
        self._pairs: list[tuple[float, float]] = []

    def next_uniforms(self) -> tuple[float, float]:
        """(text uniform, audio uniform) of the next step."""
        if not self._pairs:
            block = torch.rand(self.BLOCK, 2, generator=self.generator).tolist()
            self._pairs = [tuple(pair) for pair in reversed(block)]  # pop() from the end = in order
        return self._pairs.pop()


def sample_tokens(
    logits: torch.Tensor,
    params: Sequence[StreamSampling],
    histories: Sequence[Sequence[int]],
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """logits [B, V] (any float dtype), one StreamSampling, history and uniform per row -> [B] long.

    Rows may mix streams and settings (e.g. text rows and audio rows of many requests).
    """
    rows = logits.shape[0]
    if not (len(params) == len(histories) == rows == uniforms.shape[0]):
        raise ValueError(f"sample_tokens: {rows} logits rows, {len(params)} params, "
                         f"{len(histories)} histories, {uniforms.shape[0]} uniforms")
    for p in params:
        if not isinstance(p, StreamSampling):
            raise TypeError("sample_tokens takes one StreamSampling per row: pass params.text or params.audio")
    device = logits.device
    logits = apply_repetition_penalty(logits, params, histories)
    logprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # [B, V]
    tokens = logprobs.argmax(dim=-1)  # greedy rows; first max
    sampled = [i for i, p in enumerate(params) if not p.is_greedy]
    if not sampled:
        return tokens
    temps = torch.tensor([params[i].temperature for i in sampled], dtype=torch.float32)
    probs = torch.exp(logprobs[_index(sampled, device)] / temps.to(device, non_blocking=True)[:, None])
    u = uniforms.to(device=device, dtype=torch.float32, non_blocking=True)[_index(sampled, device)]
    picks = torch.empty(len(sampled), dtype=torch.long, device=device)
    top_k_rows = [j for j, i in enumerate(sampled) if params[i].top_k > 0]
    full_rows = [j for j, i in enumerate(sampled) if params[i].top_k == 0]
    if top_k_rows:
        ks = [min(params[sampled[j]].top_k, probs.shape[1]) for j in top_k_rows]
        sub = _index(top_k_rows, device)
        top_probs, top_ids = torch.topk(probs[sub], max(ks), dim=-1)  # [R, kmax], descending
        keep = torch.arange(max(ks), device=device)[None, :] < torch.tensor(ks).to(device, non_blocking=True)[:, None]
        picked = _inverse_cdf(torch.where(keep, top_probs, torch.zeros_like(top_probs)), u[sub])
        picks[sub] = top_ids.gather(1, picked[:, None]).squeeze(1)
    if full_rows:
        sub = _index(full_rows, device)
        picks[sub] = _inverse_cdf(probs[sub], u[sub])
    return tokens.index_copy(0, _index(sampled, device), picks)


def _index(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """weights [R, N] >= 0 (unnormalised), u [R] in [0, 1) -> index [R] with P(i) ~ weights[i]."""
    cdf = weights.cumsum(dim=-1)
    target = u * cdf[:, -1]
    index = (cdf <= target[:, None]).sum(dim=-1)  # first index whose cdf exceeds the target
    # u * total can round up to total: fall back to the last index with positive weight.
    last_positive = (weights > 0).cumsum(dim=-1).argmax(dim=-1)
    return torch.minimum(index, last_positive)


def apply_repetition_penalty(
    logits: torch.Tensor, params: Sequence[StreamSampling], histories: Sequence[Sequence[int]]
) -> torch.Tensor:
    """logits [B, V] -> penalised copy (or `logits` itself when no row is penalised)."""
    rows: list[int] = []
    cols: list[int] = []
    penalties: list[float] = []
    for row, (p, history) in enumerate(zip(params, histories)):
        if not p.penalises(len(history)):
            continue
        window = dict.fromkeys(int(t) for t in history[-p.repetition_window:])  # duplicates once
        rows += [row] * len(window)
        cols += list(window)
        penalties += [p.repetition_penalty] * len(window)
    if not rows:
        return logits
    device = logits.device
    r, c = _index(rows, device), _index(cols, device)
    penalty = torch.tensor(penalties, dtype=torch.float32).to(device, non_blocking=True)
    scores = logits[r, c].float()
    # fp32 math and one rounding to the logits dtype, as the official in-dtype ops on CUDA
    # (which divide by a scalar as a multiply by its fp32 reciprocal).
    scores = torch.where(scores < 0, scores * penalty, scores * (1.0 / penalty)).to(logits.dtype)
    logits = logits.clone()
    logits[r, c] = scores
    return logits
