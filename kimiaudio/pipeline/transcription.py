"""The user's words: a committed user turn transcribed in the served engine, beside the answers.

A transcription is an ordinary turn with the official ASR prompt (a user text message holding
the ASR instruction, then the audio), text only, at the engine's BACKGROUND_PRIORITY: it is
batched with the answers but never takes a step's room from one (engine/scheduler.py). Its
audio is the turn's own: the LM worker finds the utterance's codes and Whisper features in
its encode cache (or in the batch encoding it for the answer), so nothing is encoded twice.
"""

from __future__ import annotations

import numpy as np

from kimiaudio.engine.request import BACKGROUND_PRIORITY
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.pipeline.turn_request import HistoryTurn, TurnRequest
from kimiaudio.text.asr_instruction import asr_instruction
from kimiaudio.text.output_type import TEXT


def transcription_request(
    conversation_id: str,
    pcm16k: np.ndarray,
    sampling: SamplingParams,
    *,
    language: str | None = None,
    prompt: str = "",
    priority: int = BACKGROUND_PRIORITY,
    logprobs: bool = False,
) -> TurnRequest:
    """The ASR turn of one utterance (16 kHz): `prompt` (prior text context, if any), then the
    official instruction (for a checked `language`: asr_instruction), then the audio; text only.
    At background priority unless a client waits for it (/v1/audio/transcriptions)."""
    prior = [HistoryTurn("user", text=prompt)] if prompt else []
    return TurnRequest(
        conversation_id=conversation_id,
        history=[*prior, HistoryTurn("user", text=asr_instruction(language))],
        user_audio=pcm16k,
        sampling=sampling,
        output_type=TEXT,
        priority=priority,
        logprobs=logprobs,
    )
