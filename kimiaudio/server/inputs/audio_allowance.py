"""How much more audio a request may bring under one of its limits, spent part by part as decoded.

A few compressed kilobytes can hold an hour of audio: minutes of CPU and gigabytes once
decoded. So a request's audio is limited while it is decoded, not once it all is: each part
is decoded with a DurationLimit of what is left of its allowances (audio/io.py stops decoding
there), what it held is taken off them, and the part that would go past one is refused,
naming that part, before any later part is read (inputs/audio_input.py).

A /v1 chat request has two (v1/chat_body.py): each message's audio parts together may last
audio.max_input_seconds, as any one spoken turn (a Realtime turn, a transcription's file); and
every message's audio together may last what engine.max_model_len positions hold (a second of
speech takes the pipeline's speech_positions_per_second, 12.5 for Kimi-Audio). A chat prompt
is never truncated, so more than that could only end in context_length_exceeded, which is that
refusal's code too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kimiaudio.config import Config
from kimiaudio.server.api_error import ApiError


@dataclass
class AudioAllowance:
    """`left` of `total` seconds; once spent, a 400 `code` saying "`what` last more than `total`
    s (`why`)"."""

    total: float
    code: str
    what: str
    why: str
    left: float = field(init=False)

    def __post_init__(self) -> None:
        self.left = self.total

    def take(self, seconds: float) -> None:
        self.left = max(self.left - seconds, 0.0)

    def spent_error(self, param: str) -> ApiError:
        return ApiError(
            400, self.code, f"{param}: {self.what} last more than {self.total:g} s ({self.why})", param=param
        )


def message_allowance(config: Config) -> AudioAllowance:
    """One message's audio parts together: audio.max_input_seconds, one spoken turn's."""
    return AudioAllowance(
        config.audio.max_input_seconds,
        "invalid_audio",
        "this message's audio parts together",
        "audio.max_input_seconds",
    )


def request_allowance(config: Config, positions_per_second: float) -> AudioAllowance:
    """Every message's audio parts together: what engine.max_model_len positions hold, at
    `positions_per_second` of speech."""
    positions = config.engine.max_model_len
    return AudioAllowance(
        positions / positions_per_second,
        "context_length_exceeded",
        "the request's audio parts together",
        f"engine.max_model_len is {positions} positions, and a second of speech takes {positions_per_second:g}",
    )
