"""What goes into the engine: a request (EngineRequest) and its prompt, its priority, and the errors for a
request the engine cannot run. What a step returns is in step_output.py. No torch."""

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
class RequestPrompt:
    """A prompt of two streams plus the features of its continuous positions.

    audio_ids / text_ids / continuous_mask have one entry per prompt position; `features` is a
    Tensor [N, adaptor_dim] whose rows fill the N continuous positions in order (or None).
    """

    audio_ids: list[int]
    text_ids: list[int]
    continuous_mask: list[int]
    features: Any  # torch.Tensor [N, adaptor_dim] | None


@dataclass
class EngineRequest:
    """What a caller submits: a prompt, its sampling params, output type and stop rules.

    `specials` is the `SpecialTokens`-like object StreamRules reads its ids from.
    """

    request_id: str
    prompt: RequestPrompt
    params: Any  # kimiaudio.engine.sampling_params.SamplingParams
    output_type: str  # "text" | "both"
    specials: Any
    priority: int = ANSWER_PRIORITY  # BACKGROUND_PRIORITY: never takes a step's room from an answer
