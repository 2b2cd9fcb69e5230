"""What a caller submits to the pipeline: one user turn with the conversation before it.

The user's turn is what they said (`user_audio`) or what they wrote (`user_text`), exactly one
of the two: a spoken turn is encoded and answered as an audio message, a written one as a
user text message (the official prompt answers either: text/prompt.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kimiaudio.engine.request import ANSWER_PRIORITY
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.turn_prompt import Truncation
from kimiaudio.pipeline.voice_registry import Voice


@dataclass
class HistoryTurn:
    """One earlier turn of the conversation, as a TurnRequest's history carries it."""

    role: str  # "user" | "assistant"
    text: str = ""
    audio: np.ndarray | None = None  # user turns: float32 mono 16 kHz (re-encoded when not cached)
    audio_tokens: list[int] | None = None  # assistant turns: generated VQ codes (no offset)


@dataclass
class TurnRequest:
    """One user turn as a caller submits it (Pipeline.submit): spoken or written, not both."""

    conversation_id: str
    history: list[HistoryTurn]
    user_audio: np.ndarray | None = None  # float32 mono 16 kHz: a spoken turn
    sampling: SamplingParams | None = None  # None: config [sampling]
    output_type: str = "both"  # "both" (text + speech) | "text"
    voice: Voice | None = None  # the voice prompt its speech is conditioned on; None = the model's own
    # Text at which the answer ends (not included), as OpenAI's `stop`; its speech ends there too.
    stop: tuple[str, ...] = ()
    logprobs: bool = False  # report the text tokens' log-probabilities (TextDelta, TurnDone)
    # request.py's ANSWER_PRIORITY, or BACKGROUND_PRIORITY for work nobody waits on to speak
    # (the user's words transcribed: pipeline/transcription.py)
    priority: int = ANSWER_PRIORITY
    user_text: str | None = None  # a written turn (user_audio None)
    # How the history may be cut to fit (turn_prompt.py; its `pinned` count messages: each turn
    # of the history is one); None keeps the whole history, and what does not fit is refused.
    truncation: Truncation | None = None
    # How much faster than generated its speech is played (a Realtime session's speed): the
    # detokenizer's deadlines follow the audio as the listener hears it.
    playback_speed: float = 1.0

    def __post_init__(self) -> None:
        if (self.user_audio is None) == (self.user_text is None):
            raise KimiAudioError(
                "a turn needs the user's audio or the user's text, exactly one of them "
                f"(got {'both' if self.user_audio is not None else 'neither'})"
            )
        if self.user_text is not None and not self.user_text:
            raise KimiAudioError("the user's text is empty: there is nothing to answer")
