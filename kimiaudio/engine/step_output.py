"""What an engine step returns: one StepOutput per request that moved, and on a finished
request's last output its Completion. No torch."""

from __future__ import annotations

from dataclasses import dataclass


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
    # The step that computed it (EngineStats.num_steps once it ran; an overlapped step's
    # outputs come from a later `step` call); 0 for an end decided outside any step.
    step: int = 0
