"""The engine's API values: what a caller submits (EngineRequest), what each step reports
(StepOutput), and the error for a request the engine cannot run. No torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimiaudio.errors import KimiAudioError


class RequestError(KimiAudioError):
    """A request the engine cannot run (bad input, or too long for the KV pool). A subclass
    that is the client's to fix names OpenAI's error `code` for it; None: a plain failure."""

    code: str | None = None


class PromptTooLongError(RequestError):
    """A prompt longer than engine.max_model_len: the client's to shorten, so its `code` (OpenAI's)
    travels with the failed turn (TurnDone.error_code) to the client's error."""

    code = "context_length_exceeded"


# Request priorities, most urgent first (a smaller number is served first in every step).
ANSWER_PRIORITY = 0  # an answer someone is waiting to hear
BACKGROUND_PRIORITY = 1  # work nobody waits on to speak (the user's words transcribed)


@dataclass
class EngineRequest:
    """What a caller submits: a prompt of two streams plus features, params and stop rules.

    audio_ids / text_ids / continuous_mask have one entry per prompt position; `features` is a
    Tensor [N, adaptor_dim] whose rows fill the N continuous positions in order (or None).
    `specials` is the `SpecialTokens`-like object StreamRules reads its ids from.
    """

    request_id: str
    audio_ids: list[int]
    text_ids: list[int]
    continuous_mask: list[int]
    features: Any  # torch.Tensor [N, adaptor_dim] | None
    params: Any  # kimiaudio.engine.sampling_params.SamplingParams
    output_type: str  # "text" | "both"
    specials: Any
    priority: int = ANSWER_PRIORITY  # BACKGROUND_PRIORITY: never takes a step's room from an answer


@dataclass(frozen=True)
class Completion:
    """A finished request's official return values (KimiAudio._generate_loop's): the counted
    text tokens (before the text EOS) and audio tokens (after the delay, offsets kept)."""

    text_tokens: list[int]
    audio_tokens: list[int]
    num_steps: int  # generated positions


@dataclass
class StepOutput:
    """One generated step of one request (or its end: finished, reason, error).

    Carries everything a caller needs, so nobody reads the engine's sequences: the prompt
    positions served from the prefix cache (at the request's last admission) and, on the
    finishing output of a request that generated, its Completion."""

    request_id: str
    seq_id: int
    text_token: int | None
    audio_token: int | None
    finished: bool
    finish_reason: str | None = None  # StreamRules' reason, "abort", "length" or "error"
    error: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    completion: Completion | None = None
    # The text token's log-probability and the likeliest alternatives [(id, logprob)] (when
    # the request asked for them), from the sampler's distribution; None for a forced token.
    text_logprob: float | None = None
    text_top: tuple[tuple[int, float], ...] | None = None
