"""Sampling settings of one token stream (text or audio), as the sampler (sampler.py) applies them.

The ranges are the config's [sampling] ones (config/), declared once; the engine's
SamplingParams (engine/sampling_params.py) holds one StreamSampling per stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from kimiaudio.config import (
    PRESENCE_FREQUENCY_PENALTY,
    REPETITION_PENALTY,
    REPETITION_WINDOW,
    TEMPERATURE,
    TOP_K,
    TOP_P,
)
from kimiaudio.validation import check_fields, setting

GREEDY_TEMPERATURE = 1e-6  # official: temperatures at or below this are greedy


@dataclass(frozen=True)
class StreamSampling:
    """Sampling settings of one stream (text or audio)."""

    # No defaults: a stream's values come from SamplingParams (whose defaults are config [sampling]'s).
    temperature: float = setting(bounds=TEMPERATURE)
    top_k: int = setting(bounds=TOP_K)
    repetition_penalty: float = setting(bounds=REPETITION_PENALTY)
    repetition_window: int = setting(bounds=REPETITION_WINDOW)
    # Not official; the defaults leave the official sampler exactly as it is.
    top_p: float = setting(1.0, TOP_P)
    presence_penalty: float = setting(0.0, PRESENCE_FREQUENCY_PENALTY)
    frequency_penalty: float = setting(0.0, PRESENCE_FREQUENCY_PENALTY)

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= GREEDY_TEMPERATURE

    @property
    def counts_penalised(self) -> bool:
        """Whether OpenAI's presence / frequency penalties apply (to the tokens' counts)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def penalises(self, history_len: int) -> bool:
        return self.repetition_penalty > 1.0 and history_len > self.repetition_window
