"""One turn on the detokenizer worker: its DetokStream, its playback clock, its end.

The detokenizer worker owns DetokTurn. Codes arrive from the LM worker as they are
generated; `result` arrives once the LM is done with the turn (its TurnDone so far), after
which the remaining chunks are flushed and the TurnDone is delivered.
"""

from __future__ import annotations

import numpy as np

from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE
from kimiaudio.audio.time_stretch import MAX_INPUT_LAG_S
from kimiaudio.detok.streaming import DetokStream
from kimiaudio.pipeline.events import AudioChunk, TurnDone
from kimiaudio.pipeline.turn_handle import TurnHandle


class DetokTurn:
    def __init__(self, handle: TurnHandle, stream: DetokStream, playback_speed: float = 1.0):
        self.handle = handle
        self.stream = stream
        self.playback_speed = playback_speed  # its audio plays this much faster than generated
        self.result: TurnDone | None = None  # set when the LM has finished the turn
        self.first_pcm_s: float | None = None  # seconds since submit
        self.samples_sent = 0
        # Codes pushed since the last chunk went out: the next chunk names them (the whole
        # list lives with the LM worker's LmTurn, which reports it in TurnDone).
        self._unsent_codes: list[int] = []

    @property
    def turn_id(self) -> str:
        return self.handle.turn_id

    @property
    def final(self) -> bool:
        """No more codes will come: every buffered one is to be flushed."""
        return self.result is not None

    @property
    def is_playing(self) -> bool:
        """Its first audio went out (the real-time guard may lower its later chunks' steps)."""
        return self.first_pcm_s is not None

    @property
    def next_chunk_s(self) -> float:
        """Seconds of listening its next chunk releases (the guard's forecast of its margin)."""
        return self.stream.next_chunk_seconds / self.playback_speed

    @property
    def has_chunk_due(self) -> bool:
        return self.stream.ready(self.final)

    @property
    def playback_deadline(self) -> float:
        """perf_counter time at which the listener's audio runs out if it plays from the first
        chunk on: before any audio, the submit time (it is waiting already). Audio played at
        another speed lasts samples / speed, less what the time stretch still holds back."""
        if self.first_pcm_s is None:
            return self.handle.submitted_at
        samples = self.samples_sent
        if self.playback_speed != 1.0:
            samples = max(0, samples - round(MAX_INPUT_LAG_S * SPEECH_OUTPUT_RATE))
        return self.handle.submitted_at + self.first_pcm_s + samples / (SPEECH_OUTPUT_RATE * self.playback_speed)

    def push(self, codes: list[int]) -> None:
        self.stream.push(codes)
        self._unsent_codes += codes

    def chunk(self, wav) -> AudioChunk | None:
        pcm = np.asarray(wav.numpy() if hasattr(wav, "numpy") else wav, dtype=np.float32).reshape(-1)
        if pcm.size == 0:
            return None
        if self.first_pcm_s is None:
            self.first_pcm_s = self.handle.seconds()
        self.samples_sent += pcm.size
        codes, self._unsent_codes = tuple(self._unsent_codes), []
        return AudioChunk(pcm, codes)
