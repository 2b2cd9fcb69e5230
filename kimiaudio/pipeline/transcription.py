"""The user's words: a committed user turn transcribed in the served engine, beside the answers.

A transcription is an ordinary turn with the official ASR prompt (a user text message holding
ASR_INSTRUCTION, then the audio), text only, at the engine's BACKGROUND_PRIORITY: it is
batched with the answers but never takes a step's room from one (engine/scheduler.py). Its
audio is the turn's own: the LM worker finds the utterance's codes and Whisper features in
its encode cache (or in the batch encoding it for the answer), so nothing is encoded twice.
"""

from __future__ import annotations

import numpy as np

from kimiaudio.engine.engine_io import BACKGROUND_PRIORITY
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.pipeline.turn_request import HistoryTurn, TurnRequest
from kimiaudio.text.output_type import TEXT
from kimiaudio.text.prompt import ASR_INSTRUCTION


def transcription_request(conversation_id: str, pcm16k: np.ndarray, sampling: SamplingParams) -> TurnRequest:
    """The ASR turn of one user utterance (16 kHz), at background priority."""
    return TurnRequest(conversation_id=conversation_id, history=[HistoryTurn("user", text=ASR_INSTRUCTION)],
                       user_audio=pcm16k, sampling=sampling, output_type=TEXT, priority=BACKGROUND_PRIORITY)
