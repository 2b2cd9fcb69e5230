"""What a caller submits to the pipeline: one user turn with the conversation before it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kimiaudio.engine.request import ANSWER_PRIORITY
from kimiaudio.engine.sampling_params import SamplingParams
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
    """One user turn as a caller submits it (Pipeline.submit)."""

    conversation_id: str
    history: list[HistoryTurn]
    user_audio: np.ndarray  # float32 mono 16 kHz
    sampling: SamplingParams | None = None  # None: config [sampling]
    output_type: str = "both"  # "both" (text + speech) | "text"
    voice: Voice | None = None  # the voice prompt its speech is conditioned on; None = the model's own
    # Text at which the answer ends (not included), as OpenAI's `stop`; its speech ends there too.
    stop: tuple[str, ...] = ()
    logprobs: bool = False  # report the text tokens' log-probabilities (TextDelta, TurnDone)
    # request.py's ANSWER_PRIORITY, or BACKGROUND_PRIORITY for work nobody waits on to speak
    # (the user's words transcribed: pipeline/transcription.py)
    priority: int = ANSWER_PRIORITY
