"""A chat request's sampling: its OpenAI fields (already in OpenAI's ranges, inputs/openai_params.py)
over the configured [sampling], each held to its [sampling] range too.

The fields set the text stream's settings; the speech stream keeps [sampling]'s. OpenAI's ranges
reach past two of the engine's: top_p 0 keeps the likeliest token alone, which is greedy sampling
(the engine's nucleus is a mass above 0), whatever the temperature; a seed is OpenAI's int64, and
a negative one is taken as its 64 bits read unsigned (the engine's seeds are unsigned).
"""

from __future__ import annotations

from kimiaudio.config import Config, check_setting
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import ConfigError
from kimiaudio.server.api_error import ApiError

# OpenAI's chat fields -> the engine's sampling settings of the text stream.
_SAMPLING_KEYS = (
    ("max_tokens", "max_new_tokens"),
    ("max_completion_tokens", "max_new_tokens"),
    ("temperature", "text_temperature"),
    ("top_p", "text_top_p"),
    ("presence_penalty", "text_presence_penalty"),
    ("frequency_penalty", "text_frequency_penalty"),
    ("seed", "seed"),
)


def chat_sampling(values: dict, config: Config) -> SamplingParams:
    """The configured sampling with the body's overrides (`values`: the checked OpenAI fields)."""
    values = _engine_values(values)
    overrides = {}
    for key, ours in _SAMPLING_KEYS:  # max_completion_tokens after max_tokens: it wins
        if values.get(key) is None:
            continue
        try:
            overrides[ours] = check_setting("sampling", ours, values[key])
        except ConfigError as exc:
            expected = str(exc).partition(": expected ")[2]  # "<what>, got <value>"
            raise ApiError(400, "invalid_value", f"{key}: expected {expected}"[:300], param=key) from None
    return SamplingParams.from_config(config.sampling, text_top_logprobs=values.get("top_logprobs") or 0, **overrides)


def _engine_values(values: dict) -> dict:
    """OpenAI's values that the engine's settings have no room for, as the engine says them."""
    values = dict(values)
    if values.get("top_p") == 0:
        values["top_p"], values["temperature"] = None, 0.0
    if values.get("seed") is not None and values["seed"] < 0:
        values["seed"] %= 2**64
    return values
