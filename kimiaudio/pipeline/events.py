"""Events a turn produces, in order: UserEncoded (a spoken turn's only, once its prompt is in the
engine), then TextDelta / AudioChunk as they are generated, then exactly one TurnDone. They cross from the GPU worker
thread to the asyncio loop, so they are plain immutable values."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class UserEncoded:
    audio_tokens: list[int]  # VQ codes of the user's audio (no token offset), kept for history
    seconds: float


@dataclass(frozen=True)
class TokenLogprob:
    """One generated text token with its log-probability (from the sampler's distribution) and,
    when asked for, the likeliest alternatives at its position, as (bytes, logprob)."""

    token_id: int
    token_bytes: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...] = ()


@dataclass(frozen=True)
class TextDelta:
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()  # of the tokens decoded since the last delta, when asked for
    # The text stream's tokens fed back since the last delta, one per position (blanks and the
    # text EOS included, as TurnDone's text_tokens): joined over a turn's deltas, the positions
    # its text so far came from, so what was heard of it can be kept while it plays.
    text_tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class AudioChunk:
    pcm: np.ndarray  # float32 mono at audio/rates.py's SPEECH_OUTPUT_RATE (the vocoder's; the pipeline refuses another)
    # Speech codes (no offset) that reached the detokenizer since the previous chunk: joined over
    # a turn's chunks they are its codes so far, so what was heard can be kept as codes while
    # the answer plays (samples_per_code samples each), before TurnDone brings them all.
    codes: tuple[int, ...] = ()


@dataclass(frozen=True)
class TurnDone:
    status: str  # completed | cancelled | failed
    text: str = ""
    text_tokens: list[int] = field(default_factory=list)
    audio_tokens: list[int] = field(default_factory=list)  # VQ codes (no offset)
    # Seconds since submit: queued_s, encoded_s, prefill_done_s, first_text_s,
    # first_audio_token_s, first_pcm_s, done_s.
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    # Why a failed turn failed when it was the request's fault, machine-readable (OpenAI's code,
    # e.g. "context_length_exceeded"): the server answers it as the client's error, not its own.
    error_code: str | None = None
    finish_reason: str | None = None
    prefill_tokens_computed: int = 0
    prefill_tokens_cached: int = 0
    # Of the prompt's positions, those holding a speech code (the user's audio, earlier spoken
    # answers) and those holding a text token: the two streams run side by side, so a spoken
    # answer in the history counts in both, and the markers in neither.
    prompt_audio_tokens: int = 0
    prompt_text_tokens: int = 0
    # The text tokens of the answer (before the text EOS, no blanks); its speech codes are
    # audio_tokens.
    generated_text_tokens: int = 0
    # The text tokens of `text` (up to a stop string) with their log-probabilities, when asked for.
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # Engine steps run from the LM worker taking the turn to its first speech code (None: no
    # speech): what a bench compares when other work shares the engine.
    first_audio_steps: int | None = None


PipelineEvent = UserEncoded | TextDelta | AudioChunk | TurnDone
