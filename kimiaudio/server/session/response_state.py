"""ResponseState: one assistant response of a real-time session, what was generated and what
was heard.

The Responder (responder.py) runs the flow; this holds the response's state and the two
derived values it stores: the audio and tokens that were actually heard (all of them, or,
after a barge-in or a conversation.item.truncate, the played prefix) and the timings
reported in response.done.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE
from kimiaudio.pipeline.events import TurnDone
from kimiaudio.pipeline.turn_handle import TurnHandle
from kimiaudio.pipeline.turn_request import HistoryTurn
from kimiaudio.server.session.queued_turn import new_item_id, new_response_id


def _state(default: Any = None, factory: Callable[[], Any] | None = None) -> Any:
    """A field of the response's state: not a constructor argument, it starts at its default."""
    if factory is not None:
        return field(default_factory=factory, init=False)
    return field(default=default, init=False)


@dataclass
class ResponseState:
    output_type: str  # "both" | "text"
    handle: TurnHandle  # the pipeline's
    user_index: int  # stored index of the user turn it answers
    user_turn: HistoryTurn  # that turn (a spoken one's VQ codes arrive with UserEncoded)
    committed_at: float  # time.monotonic() of the commit
    speed: float = 1.0  # its audio is played this much faster than generated (TimeStretch)
    id: str = _state(factory=new_response_id)
    item_id: str = _state(factory=new_item_id)  # the assistant item it makes
    previous_item_id: str | None = _state()  # the item before it in the conversation
    announced: dict[str, Any] = _state(factory=dict)  # its response object, as response.created sent it
    text: str = _state("")
    text_tokens: list[int] = _state(factory=list)  # the text stream's tokens that `text` came from, so far
    pcm: list[np.ndarray] = _state(factory=list)  # 24 kHz chunks as played (add_pcm), stretched by `speed`
    num_samples: int = _state(0)  # in `pcm`, kept as chunks come: the recorder asks every second
    codes: list[int] = _state(factory=list)  # speech codes of those chunks, as they came
    cancelled: bool = _state(False)
    generation_ended: bool = _state(False)
    # Generated and heard whole (played out; a text answer: all its text sent) and now only
    # being stored and told: a barge-in or cancel from here on has nothing left to cut.
    delivered: bool = _state(False)
    played_samples: int | None = _state()  # samples heard, set when playback was cut short (None: all)
    truncated_ms: int | None = _state()  # where a conversation.item.truncate cut its item's audio
    playback_cut: bool = _state(False)  # its audio was stopped while it played (output_audio_buffer.cleared)
    cancel_reason: str | None = _state()  # turn_detected (barge-in) | client_cancelled
    done: TurnDone | None = _state()  # the pipeline's, once generation ended
    first_played_at: float | None = _state()
    stored: tuple[int, HistoryTurn] | None = _state()  # the assistant turn once stored: (index, its history turn)
    task: asyncio.Task[None] | None = _state()
    playback_done: asyncio.Event = _state(factory=asyncio.Event)  # its last audio played (or it was cut)
    # Progressive storing (answer_storage.py `record`): set at the first audio played (the first
    # text sent, for a text answer); set to stop; samples already stored; the recording task.
    first_heard: asyncio.Event = _state(factory=asyncio.Event)
    stop_recording: asyncio.Event = _state(factory=asyncio.Event)
    recorded_samples: int = _state(0)
    recorder: asyncio.Task[None] | None = _state()

    def codes_heard(self, samples: int, samples_per_code: int | None) -> list[int]:
        """The codes of the first `samples` heard, rounded up so the code being spoken is kept."""
        if samples_per_code is None:
            return []
        return self.codes[: self._codes_in(samples, samples_per_code)]

    def _codes_in(self, samples: int, samples_per_code: int) -> int:
        """How many codes `samples` of its audio as played span, the code being spoken counted
        (at a speed other than 1, a code's samples_per_code samples play in samples_per_code /
        speed)."""
        return math.ceil(round(samples * self.speed, 6) / samples_per_code)

    def add_pcm(self, chunk: np.ndarray) -> None:
        self.pcm.append(chunk)
        self.num_samples += chunk.size

    def pcm_between(self, start: int, end: int) -> np.ndarray:
        """Samples [start, end) of the audio generated, joining only the chunks they lie in (the
        recorder takes one second at a time from an answer that may be minutes long)."""
        parts, offset = [], 0
        for chunk in self.pcm:
            if offset >= end:
                break
            if offset + chunk.size > start:
                parts.append(chunk[max(0, start - offset) : end - offset])
            offset += chunk.size
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    @property
    def audio_seconds(self) -> float:
        return self.num_samples / SPEECH_OUTPUT_RATE

    def heard(self, done: TurnDone, samples_per_code: int | None) -> tuple[np.ndarray, list[int]]:
        """(24 kHz audio, VQ codes) that the user heard: everything, or the played prefix
        (samples_per_code None: a text-only server, no speech at all)."""
        pcm = np.concatenate(self.pcm) if self.pcm else np.zeros(0, dtype=np.float32)
        tokens = list(done.audio_tokens) or list(self.codes)  # a cancel unconfirmed by TurnDone: the chunks' codes
        if self.played_samples is None:
            return pcm, tokens
        if samples_per_code is None:
            return pcm[:0], []
        played = min(self.played_samples or 0, pcm.size)
        # The codes of the audio heard (each code is `samples_per_code` samples, 80 ms of speech
        # with the official detokenizer, before `speed` stretches it), rounded up so the code
        # being spoken when the user cut in is kept. Not in proportion to the audio generated:
        # at a cut-in, codes generated but not yet detokenized are in `tokens` but not in `pcm`.
        keep = min(len(tokens), self._codes_in(played, samples_per_code))
        return pcm[:played], tokens[:keep]

    def timings(self, done: TurnDone) -> dict[str, float]:
        """The pipeline's timings (seconds since submit) plus commit -> first audio played."""
        timings = {key: round(float(value), 4) for key, value in done.timings.items()}
        if self.first_played_at is not None:
            timings["commit_to_first_audio_s"] = round(self.first_played_at - self.committed_at, 4)
        if self.played_samples is not None:
            timings["played_s"] = round(self.played_samples / SPEECH_OUTPUT_RATE, 3)
        return timings
