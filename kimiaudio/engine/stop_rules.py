"""The official per-sequence generation rules, as a small state machine (no torch).

Follows KimiAudio._generate_loop (kimia_infer/api/kimia.py). Per step, given the raw sampled
text and audio tokens:
- text: once the text stream has finished, force the text blank; a sampled text EOS finishes
  the stream (the EOS itself is fed back once, not counted); any other token is counted;
- audio: the first `audio_delay` steps, and every step in "text" mode, force the text blank;
  otherwise the token is counted (including a terminating msg_end/media_end);
- stop: "text" mode when the text EOS is sampled, "both" mode when the (unforced) audio token
  is msg_end or media_end, and either mode after `max_new_tokens` steps. With `ignore_eos`
  (not official; vLLM's name: the bench's fixed-length turns) only the length stops.
The forced tokens are what is fed back at the next step and what the repetition penalty sees.
`text_tokens`/`audio_tokens` are the loop's official return values (raw ids, offsets kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimiaudio.text.output_type import BOTH, check_output_type

# Official limits: "both" -> 1500 positions in all (120 s of 12.5 Hz audio); "text" -> 7500.
BOTH_MAX_POSITIONS = int(12.5 * 120)
TEXT_MAX_POSITIONS = 7500


def official_max_new_tokens(output_type: str, prompt_len: int, override: int = 0) -> int:
    """Steps the official generate() allows; a positive `override` replaces the official limit."""
    check_output_type(output_type)
    if override > 0:
        return override
    return (BOTH_MAX_POSITIONS if output_type == BOTH else TEXT_MAX_POSITIONS) - prompt_len


def official_codes(audio_tokens: list[int], token_offset: int) -> list[int]:
    """VQ codes as official generate() keeps them: ids >= offset, minus the offset."""
    return [t - token_offset for t in audio_tokens if t >= token_offset]


def official_text_ids(text_tokens: list[int], token_offset: int) -> list[int]:
    """Text ids as official generate() decodes them: ids < offset (EOS already excluded)."""
    return [t for t in text_tokens if t < token_offset]


@dataclass(frozen=True)
class RuleTokens:
    """The special ids the rules need (from the tokenizer / config)."""

    text_blank: int
    text_eos: int
    msg_end: int
    media_end: int

    @classmethod
    def from_specials(cls, specials: Any) -> RuleTokens:
        """From any object with these four attributes (e.g. text.SpecialTokens)."""
        return cls(int(specials.text_blank), int(specials.text_eos), int(specials.msg_end), int(specials.media_end))


class StreamRules:
    def __init__(
        self, output_type: str, tokens: RuleTokens, audio_delay: int, max_new_tokens: int, ignore_eos: bool = False
    ):
        self.ignore_eos = ignore_eos
        self.output_type = output_type
        self.tokens = tokens
        self.audio_delay = audio_delay
        self.max_new_tokens = max_new_tokens
        self.text_history: list[int] = []  # tokens fed back, after the rules
        self.audio_history: list[int] = []
        self.num_valid_text = 0
        # How often each counted text token other than the blank occurred: what OpenAI's
        # presence / frequency penalties weigh (the blanks pace the stream, they are no words).
        self.text_counts: dict[int, int] = {}
        self.num_valid_audio = 0
        self.is_text_finished = False
        self.finish_reason: str | None = "length" if max_new_tokens <= 0 else None

    @property
    def num_steps(self) -> int:
        return len(self.text_history)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def is_awaiting_audio(self) -> bool:
        """Speech is asked for and none of it has been generated yet (the delay steps included)."""
        return self.output_type == BOTH and self.num_valid_audio == 0

    @property
    def next_step_is_last(self) -> bool:
        """The next step reaches max_new_tokens: it ends the sequence whatever is sampled."""
        return self.num_steps + 1 >= self.max_new_tokens

    def forced(self) -> tuple[int | None, int | None]:
        """The (text, audio) ids the next step feeds back whatever is sampled; None where the
        sample itself is fed back. Known before the step's samples are: the engine can build
        the following step's input on the device from them (engine/decode_batch.py)."""
        blank = self.tokens.text_blank
        text = blank if self.is_text_finished else None
        audio = blank if self.num_steps < self.audio_delay or self.output_type == "text" else None
        return text, audio

    def step(self, sampled_text: int, sampled_audio: int) -> tuple[int, int, bool, str | None]:
        """Apply the rules to one step's raw samples -> (text, audio, finished, reason).

        reason: "stop" (text EOS in text mode, audio msg_end/media_end in both mode) or
        "length" (max_new_tokens reached).
        """
        if self.is_finished:
            raise RuntimeError("StreamRules.step called after the sequence finished")
        forced_text, forced_audio = self.forced()
        text = int(sampled_text)
        if forced_text is not None:
            text = forced_text
        elif text == self.tokens.text_eos:
            self.is_text_finished = True
        else:
            self.num_valid_text += 1
            if text != self.tokens.text_blank:
                self.text_counts[text] = self.text_counts.get(text, 0) + 1

        audio = int(sampled_audio)
        if forced_audio is not None:
            audio = forced_audio
        else:
            self.num_valid_audio += 1

        self.text_history.append(text)
        self.audio_history.append(audio)
        stopped = (
            self.is_text_finished
            if self.output_type == "text"
            else audio in (self.tokens.msg_end, self.tokens.media_end)
        )
        if stopped and not self.ignore_eos:
            self.finish_reason = "stop"
        elif self.num_steps >= self.max_new_tokens:
            self.finish_reason = "length"
        return text, audio, self.is_finished, self.finish_reason

    @property
    def text_tokens(self) -> list[int]:
        """Official return value: the counted text tokens (everything before the text EOS)."""
        return self.text_history[: self.num_valid_text]

    @property
    def audio_tokens(self) -> list[int]:
        """Official return value: the counted audio tokens after the delay (ids with offset)."""
        return self.audio_history[self.audio_delay : self.audio_delay + self.num_valid_audio]
