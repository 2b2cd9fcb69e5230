"""One turn's state on the GPU worker: its handle, its detokenizer session, its timings.

The worker thread owns TurnState; the asyncio side only sees the TurnHandle, which receives
events through `loop.call_soon_threadsafe`. Text is decoded incrementally from the valid text
ids (before the text EOS, below the audio token offset) so multi-byte characters are emitted
whole.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from kimiaudio.pipeline.event_stream import EventStream
from kimiaudio.pipeline.events import PCM_SAMPLE_RATE, AudioChunk, PipelineEvent, TextDelta, TurnDone


class TurnHandle(EventStream[PipelineEvent]):
    """Async iterator of one turn's events; the last one is TurnDone."""

    def __init__(self, turn_id: str, loop: asyncio.AbstractEventLoop):
        super().__init__(loop, lambda event: isinstance(event, TurnDone))
        self.turn_id = turn_id
        self.submitted_at = time.perf_counter()

    @property
    def done(self) -> TurnDone | None:
        """The TurnDone, once it reached the loop (None while the turn runs)."""
        return self.last


@dataclass
class TurnState:
    handle: TurnHandle
    request_id: str
    token_offset: int
    text_eos: int
    seq_id: int | None = None
    detok: object | None = None  # DetokSession, None for text output
    prompt_len: int = 0
    cached_at_submit: int = 0

    def __post_init__(self) -> None:
        self.text_ids: list[int] = []
        self.audio_codes: list[int] = []
        self.raw_text: list[int] = []
        self.raw_audio: list[int] = []
        self.emitted_text = ""
        self._num_decoded = 0  # text ids already decoded into emitted_text (or withheld)
        self.text_done = False
        self.llm_done = False
        self.finish_reason: str | None = None
        self.timings: dict[str, float] = {}
        self.samples_sent = 0

    @property
    def playback_deadline(self) -> float:
        """perf_counter time at which the client's audio runs out if it plays from the first
        chunk on: before any audio, the submit time (it is waiting already)."""
        first = self.timings.get("first_pcm_s")
        if first is None:
            return self.handle.submitted_at
        return self.handle.submitted_at + first + self.samples_sent / PCM_SAMPLE_RATE

    def mark(self, name: str) -> None:
        if name not in self.timings:
            self.timings[name] = time.perf_counter() - self.handle.submitted_at

    def add_tokens(self, text_token: int | None, audio_token: int | None) -> None:
        """Record one step's tokens (after the official rules, which already force the delay
        blanks; ids below the offset, such as the terminating msg_end, are not speech)."""
        if text_token is not None:
            self.raw_text.append(text_token)
            if not self.text_done:
                if text_token == self.text_eos:
                    self.text_done = True
                elif text_token < self.token_offset:
                    self.text_ids.append(text_token)
        if audio_token is not None:
            self.raw_audio.append(audio_token)
            if audio_token >= self.token_offset:
                code = audio_token - self.token_offset
                self.audio_codes.append(code)
                if self.detok is not None:
                    self.detok.push([code])  # buffered there until a chunk is due
                self.mark("first_audio_token_s")

    def text_delta(self, tokenizer, final: bool = False) -> TextDelta | None:
        if len(self.text_ids) == self._num_decoded and not final:
            return None  # no new text id this step (e.g. blanks after the text EOS)
        self._num_decoded = len(self.text_ids)
        text = tokenizer.decode(self.text_ids)
        # A trailing U+FFFD may be a multi-byte character still being generated: wait for it
        # unless no more text can come.
        stable = text if (self.text_done or final) else text.rstrip("\ufffd")
        if len(stable) <= len(self.emitted_text) or not stable.startswith(self.emitted_text):
            return None
        delta, self.emitted_text = stable[len(self.emitted_text):], stable
        self.mark("first_text_s")
        return TextDelta(delta)

    def audio_chunk(self, wav) -> AudioChunk | None:
        pcm = np.asarray(wav.numpy() if hasattr(wav, "numpy") else wav, dtype=np.float32).reshape(-1)
        if pcm.size == 0:
            return None
        self.mark("first_pcm_s")
        self.samples_sent += pcm.size
        return AudioChunk(pcm)

    def finish(self, status: str, error: str | None, computed: int, cached: int) -> TurnDone:
        self.mark("done_s")
        return TurnDone(
            status=status, text=self.emitted_text,
            text_tokens=list(self.raw_text), audio_tokens=list(self.audio_codes), timings=dict(self.timings),
            error=error, finish_reason=self.finish_reason,
            prefill_tokens_computed=computed, prefill_tokens_cached=cached,
        )
