"""The request fields of OpenAI's API and what kimiaudio does with each: honour, refuse, or
(only where OpenAI's own service accepts it and ignores it too) ignore.

Every route lists the fields of OpenAI's API reference it knows (`Fields`): the honoured ones
it reads itself; the refused ones are accepted only with a value that asks for nothing (an
empty `tools` list, `response_format` text, ...: `neutral`), else 400 naming the field; the
ignored ones are read by nobody. Any other field is refused as OpenAI refuses an argument it
does not know. A `null` is a field not sent. Ranges of the honoured numbers are declared as
settings of a dataclass per route (validation.py's one check), OpenAI's ranges where they are
narrower than the engine's. README's compatibility table lists the same fields. The Realtime
API's fields are declared the same way in realtime_params.py.

The server serves one model, `MODEL_ID`. Requests name it as `kimi-audio-7b-instruct` (any case,
with or without the `moonshotai/` prefix, as Hugging Face spells it) or by one of [server]
model_aliases (by default OpenAI's transcription, audio chat and realtime model names, so
OpenAI's examples run unchanged); any other name is a 404 model_not_found, as OpenAI answers
it (`check_model`). The demo checkpoint answers to the same id (GET /api/status says when the
weights are the demo's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kimiaudio.config import MAX_NEW_TOKENS, PRESENCE_FREQUENCY_PENALTY, SEED, TOP_LOGPROBS
from kimiaudio.errors import ConfigError
from kimiaudio.server.api_error import ApiError
from kimiaudio.validation import Bounds, check_value, declared, setting

MODEL_ID = "kimi-audio-7b-instruct"
OUTPUT_LIMIT = Bounds(1, MAX_NEW_TOKENS.max)


def check_model(model: Any, aliases: tuple[str, ...] | list[str] = (), param: str = "model") -> str:
    """The served model id for a request's `model` (the id or one of `aliases`); ApiError if it
    names another model."""
    if model is None or model == "":
        raise ApiError(
            400, "missing_required_parameter", f"{param} is required (this server serves {MODEL_ID!r})", param=param
        )
    if not isinstance(model, str) or (model.lower().removeprefix("moonshotai/") != MODEL_ID and model not in aliases):
        raise ApiError(
            404,
            "model_not_found",
            f"the model {str(model)[:100]!r} does not exist; this server serves {MODEL_ID!r}",
            param=param,
        )
    return MODEL_ID


def voice_name(value: Any) -> Any:
    """A voice as OpenAI's clients name it: a name, or a custom voice `{"id": name}` (here the
    name of a stored voice) -> the name; any other value as it is (the voice's check says what
    was expected)."""
    if isinstance(value, dict) and value.keys() == {"id"} and isinstance(value["id"], str):
        return value["id"]
    return value


def empty(value: Any) -> bool:
    return value in ([], {}, "")


@dataclass(frozen=True)
class Fields:
    """One route's fields: `honoured` (read by the route), `neutral` (refused unless the value
    passes: field -> (test, what is accepted)), `ignored` (as OpenAI ignores them)."""

    honoured: frozenset[str]
    neutral: dict[str, tuple[Callable[[Any], bool], str]] = field(default_factory=dict)
    ignored: frozenset[str] = frozenset()

    def check(self, body: dict, where: str = "", error: Callable[[str, str, str], Exception] | None = None) -> None:
        """Refuse what `body` asks and the route cannot do; `error(code, message, param)` builds
        the exception (default: a 400 ApiError)."""
        error = error or _api_error
        for key, value in body.items():
            param = f"{where}{key}"
            if value is None or key in self.honoured or key in self.ignored:
                continue
            if key in self.neutral:
                test, accepted = self.neutral[key]
                if not test(value):
                    raise error(
                        "unsupported_parameter",
                        f"{param}: kimiaudio does not support this (accepted: "
                        f"{accepted}); see README's compatibility table",
                        param,
                    )
                continue
            raise error("unknown_parameter", f"Unrecognized request argument supplied: {param}"[:300], param)


def _api_error(code: str, message: str, param: str) -> ApiError:
    return ApiError(400, code, message, param=param)


NO_TOOLS = {  # the tool fields of a model that calls none
    "tools": (empty, "[] (kimiaudio has no function calling)"),
    "tool_choice": (lambda v: v in ("auto", "none"), '"auto" or "none" (with no tools, both call none)'),
}

CHAT_FIELDS = Fields(
    honoured=frozenset(
        {
            "model",
            "messages",
            "modalities",
            "audio",
            "n",
            "stream",
            "stream_options",
            "temperature",
            "top_p",
            "seed",
            "stop",
            "max_completion_tokens",
            "max_tokens",
            "logprobs",
            "top_logprobs",
            "presence_penalty",
            "frequency_penalty",
        }
    ),
    neutral={
        **NO_TOOLS,
        "functions": (empty, "[]"),
        "function_call": (lambda v: v == "none", '"none"'),
        "parallel_tool_calls": (lambda v: False, "nothing: there are no tools"),
        "response_format": (lambda v: v == {"type": "text"}, '{"type": "text"}'),
        "logit_bias": (empty, "{} (the model's token ids are not OpenAI's)"),
        "store": (lambda v: v is False, "false (answers are not kept for evals or distillation)"),
        "service_tier": (lambda v: v in ("auto", "default"), '"auto" or "default"'),
        "prediction": (lambda v: False, "nothing"),
        "web_search_options": (lambda v: False, "nothing"),
        "reasoning_effort": (lambda v: False, "nothing: not a reasoning model"),
        "verbosity": (lambda v: False, "nothing"),
        "prompt_cache_retention": (lambda v: False, "nothing"),
    },
    ignored=frozenset({"user", "safety_identifier", "metadata", "prompt_cache_key"}),
)

TRANSCRIPTION_FIELDS = Fields(
    honoured=frozenset(
        {
            "file",
            "model",
            "language",
            "prompt",
            "response_format",
            "stream",
            "temperature",
            "timestamp_granularities[]",
            "include[]",
        }
    ),
    neutral={
        "chunking_strategy": (lambda v: v == "auto", '"auto" (the audio is transcribed in one piece)'),
        "known_speaker_names[]": (lambda v: False, "nothing: no diarization"),
        "known_speaker_references[]": (lambda v: False, "nothing: no diarization"),
    },
)


@dataclass(frozen=True)
class ChatSampling:
    """The chat fields that set sampling, in OpenAI's ranges (v1/chat_sampling.py maps the values
    the engine says otherwise: top_p 0, a negative seed)."""

    temperature: float | None = setting(None, Bounds(0.0, 2.0))
    top_p: float | None = setting(None, Bounds(0.0, 1.0))
    presence_penalty: float | None = setting(None, PRESENCE_FREQUENCY_PENALTY)
    frequency_penalty: float | None = setting(None, PRESENCE_FREQUENCY_PENALTY)
    seed: int | None = setting(None, Bounds(-(2**63), SEED.max))  # OpenAI's int64, and the engine's uint64


@dataclass(frozen=True)
class ChatOutput:
    """The chat fields that shape what comes out: its length, its log-probabilities, one choice."""

    max_completion_tokens: int | None = setting(None, OUTPUT_LIMIT)
    max_tokens: int | None = setting(None, OUTPUT_LIMIT)
    logprobs: bool | None = None
    top_logprobs: int | None = setting(None, TOP_LOGPROBS)
    n: int | None = setting(None, Bounds(1, 1))


@dataclass(frozen=True)
class TranscriptionSampling:
    temperature: float | None = setting(None, Bounds(0.0, 1.0))


def checked(
    cls: type, values: dict, where: str = "", error: Callable[[str, str, str], Exception] | None = None
) -> dict[str, Any]:
    """The fields of `cls` that `values` holds (not null), each checked against its declaration."""
    error = error or _api_error
    out = {}
    for key, (expected, bounds) in declared(cls).items():
        if values.get(key) is None:
            continue
        try:
            out[key] = check_value(f"{where}{key}", values[key], expected, bounds)
        except ConfigError as exc:
            raise error("invalid_value", str(exc)[:300], f"{where}{key}") from None
    return out
