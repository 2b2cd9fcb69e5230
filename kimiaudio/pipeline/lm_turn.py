"""One turn on the LM worker, from submit to its end: first the user utterances it needs and
their encodings, then its engine request, the tokens generated so far and its text.

The LM worker owns LmTurn. A submitted turn waits until every utterance it needs (its history's
and the new one, when the user spoke it rather than wrote it) is encoded, holding its own
encodings so that the encode cache's evictions never take them; `messages` then makes its
prompt (user utterances as their codes and Whisper features, text turns, the user's written
turn as a user text message, earlier answers as text and codes) and `start` admits it to
generation. Text is decoded incrementally from the valid text ids (before the text EOS, below
the audio token offset), so multi-byte characters are emitted whole. Speech codes (audio ids at
or above the offset, minus it) are handed on to the detokenizer worker. A request's stop
strings end the text where the first of them begins (`stopped`; text that may be the start of
one is held back until it is not), and its tokens' log-probabilities go with the text when it
asked for them.
"""

from __future__ import annotations

import codecs

import numpy as np

from kimiaudio.pipeline.encode_cache import Encoded, audio_key
from kimiaudio.pipeline.events import TextDelta, TokenLogprob, TurnDone
from kimiaudio.pipeline.turn_handle import TurnHandle
from kimiaudio.pipeline.turn_request import HistoryTurn, TurnRequest
from kimiaudio.text.prompt import Message


class LmTurn:
    def __init__(self, handle: TurnHandle, request: TurnRequest, audio: dict[bytes, np.ndarray], queued_s: float):
        self.handle = handle
        self.request = request
        # Until it starts: key -> 16 kHz pcm of every user utterance it needs, and those encoded.
        self.audio = audio
        self.encoded: dict[bytes, Encoded] = {}
        self.queued_s = queued_s  # seconds from submit until the LM worker took it
        # Set when it starts generating:
        self.token_offset = 0
        self.text_eos = -1
        self.speaks = False  # its codes go to the detokenizer worker
        self.seq_id: int | None = None
        self.prompt_len = 0
        self.num_cached = 0  # prompt positions served from the prefix cache
        self.prompt_audio = 0  # prompt positions holding a speech code
        self.prompt_text = 0  # prompt positions holding a text token
        self.text_blank = -1
        self.raw_text: list[int] = []  # every text token fed back
        self._raw_reported = 0  # of raw_text, those the text deltas carried
        self.text_ids: list[int] = []  # the valid ones, for decoding
        self.codes: list[int] = []
        self.emitted_text = ""
        self._num_decoded = 0  # text ids already decoded into emitted_text
        self.text_done = False
        self.stopped = False  # a stop string was generated: the answer ends
        self._scores: list[tuple[int, float | None, tuple | None]] = []  # per text id: (id, logprob, top)
        self._scored = 0  # _scores entries already turned into `logprobs`
        self.logprobs: list[TokenLogprob] = []  # of the text emitted so far, when asked for
        self.timings: dict[str, float] = {}
        self.submit_step = 0  # the engine's step count (EngineStats.num_steps) when the worker took the turn
        self.first_audio_steps: int | None = None

    @property
    def turn_id(self) -> str:
        return self.handle.turn_id

    @property
    def missing(self) -> list[bytes]:
        """The utterances it still waits for."""
        return [key for key in self.audio if key not in self.encoded]

    def messages(self) -> list[Message]:
        """The prompt's messages, once nothing is missing."""
        history = (_history_message(t, self.encoded) for t in self.request.history)
        messages = [m for m in history if m is not None]
        spoken = self.request.user_audio
        if spoken is None:  # a written turn: the user's text message (official layout)
            messages.append(Message("user", "text", text=self.request.user_text or ""))
            return messages
        codes, features = self.encoded[audio_key(spoken)]
        messages.append(Message("user", "audio", audio_tokens=codes, features=features))
        return messages

    def start(self, token_offset: int, text_eos: int, speaks: bool, text_blank: int = -1) -> None:
        """Its prompt is built: generation begins. The utterances and their encodings are let go
        (the engine request holds what the prompt needs)."""
        self.token_offset, self.text_eos, self.speaks = token_offset, text_eos, speaks
        self.text_blank = text_blank
        self.audio, self.encoded = {}, {}

    def count_prompt(self, audio_ids: list[int], text_ids: list[int]) -> None:
        """Its prompt's speech-code positions and text-token positions (after `start`)."""
        self.prompt_audio = sum(1 for token in audio_ids if token >= self.token_offset)
        self.prompt_text = sum(1 for token in text_ids if token != self.text_blank)

    def mark(self, name: str) -> None:
        if name not in self.timings:
            self.timings[name] = self.handle.seconds()

    def add_tokens(
        self, text_token: int | None, audio_token: int | None, logprob: float | None = None, top: tuple | None = None
    ) -> int | None:
        """Record one step's tokens (after the official rules, which already force the delay
        blanks; ids below the offset, such as the terminating msg_end, are not speech) and the
        text token's log-probability. Returns the step's speech code, if any."""
        if text_token is not None:
            self.raw_text.append(text_token)
            if not self.text_done:
                if text_token == self.text_eos:
                    self.text_done = True
                elif text_token < self.token_offset:
                    self.text_ids.append(text_token)
                    if self.request.logprobs:
                        self._scores.append((text_token, logprob, top))
        if audio_token is None or audio_token < self.token_offset:
            return None
        code = audio_token - self.token_offset
        self.codes.append(code)
        self.mark("first_audio_token_s")
        return code

    def text_delta(self, tokenizer, final: bool = False) -> TextDelta | None:
        if self.stopped or (len(self.text_ids) == self._num_decoded and not final):
            return None  # no new text id this step (e.g. blanks after the text EOS)
        self._num_decoded = len(self.text_ids)
        text = tokenizer.decode(self.text_ids)
        # A trailing U+FFFD may be a multi-byte character still being generated: wait for it
        # unless no more text can come.
        ending = self.text_done or final
        stable = self._before_stop(text if ending else text.rstrip("\ufffd"), ending)
        if len(stable) <= len(self.emitted_text) or not stable.startswith(self.emitted_text):
            return None
        delta, self.emitted_text = stable[len(self.emitted_text) :], stable
        self.mark("first_text_s")
        tokens, self._raw_reported = tuple(self.raw_text[self._raw_reported :]), len(self.raw_text)
        return TextDelta(delta, self._new_logprobs(tokenizer), tokens)

    def _before_stop(self, text: str, ending: bool) -> str:
        """`text` cut where a stop string begins (then `stopped`); while more may come, without
        a tail that may be the start of one."""
        stops = self.request.stop
        if not stops:
            return text
        since = max(len(self.emitted_text) - max(map(len, stops)), 0)
        found = [i for i in (text.find(s, since) for s in stops) if i >= 0]
        if found:
            self.stopped = True
            return text[: min(found)]
        if ending:
            return text
        hold = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        return text[: len(text) - hold]

    def _new_logprobs(self, tokenizer) -> tuple[TokenLogprob, ...]:
        """The log-probabilities of the text ids decoded since the last call (up to the text
        emitted, after a stop)."""
        if not self.request.logprobs:
            return ()
        new, start, self._scored = [], self._scored, self._num_decoded
        for token, logprob, top in self._scores[start : self._num_decoded]:
            text = tokenizer.token_bytes(token) if logprob is not None else b""
            if logprob is None or not text:
                continue  # forced, or no text (a blank the model chose)
            new.append(TokenLogprob(token, text, logprob, tuple((tokenizer.token_bytes(t), lp) for t, lp in top or ())))
        if self.stopped:  # keep the tokens that begin before the cut
            data = b"".join(t.token_bytes for t in self.logprobs)
            kept = []
            for entry in new:
                if _char_index(data + entry.token_bytes[:1]) >= len(self.emitted_text):
                    break
                kept.append(entry)
                data += entry.token_bytes
            new = kept
        self.logprobs += new
        return tuple(new)

    def result(
        self, status: str, error: str | None = None, finish_reason: str | None = None, error_code: str | None = None
    ) -> TurnDone:
        """The turn's TurnDone as far as the LM knows it (the detokenizer adds its timings)."""
        return TurnDone(
            status=status,
            text=self.emitted_text,
            text_tokens=list(self.raw_text),
            audio_tokens=list(self.codes),
            timings=dict(self.timings),
            error=error,
            error_code=error_code,
            finish_reason=finish_reason,
            prefill_tokens_computed=max(self.prompt_len - self.num_cached, 0),
            prefill_tokens_cached=self.num_cached,
            prompt_audio_tokens=self.prompt_audio,
            prompt_text_tokens=self.prompt_text,
            generated_text_tokens=sum(1 for t in self.text_ids if t != self.text_blank),
            logprobs=list(self.logprobs),
            first_audio_steps=self.first_audio_steps,
        )


def _history_message(turn: HistoryTurn, encoded: dict[bytes, Encoded]) -> Message | None:
    if turn.role == "user":
        if turn.audio is not None:
            codes, features = encoded[audio_key(turn.audio)]
            return Message("user", "audio", audio_tokens=codes, features=features)
        return Message("user", "text", text=turn.text) if turn.text else None
    return Message.assistant_reply(turn.text, turn.audio_tokens) if turn.text or turn.audio_tokens else None


def _char_index(data: bytes) -> int:
    """The index of the character that `data`'s last byte belongs to, in the text `data` and
    what follows it decode to: counted in characters, not bytes, since bytes that are no UTF-8
    decode to one U+FFFD however many they are, and a character may span tokens."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    chars = len(decoder.decode(data))
    pending = decoder.getstate()[0]  # a character begun, not yet complete: the last byte's
    return chars if pending else chars - 1
