"""A submitted turn on the LM worker until its audio is encoded, and the prompt messages it
then makes: its history (user utterances as their codes and Whisper features, text turns,
earlier answers as text and codes) and the new user utterance."""

from __future__ import annotations

from dataclasses import dataclass, field

from kimiaudio.pipeline.encode_cache import Encoded, audio_key
from kimiaudio.pipeline.turn_request import HistoryTurn, TurnRequest
from kimiaudio.pipeline.turn import TurnHandle
from kimiaudio.text.prompt import Message


@dataclass
class PendingTurn:
    """A submitted turn waiting for its audio to be encoded; it holds its own results."""

    handle: TurnHandle
    request: TurnRequest
    audio: dict[bytes, object]  # key -> 16 kHz pcm of every user utterance it needs
    queued_s: float  # seconds from submit until the LM worker took it
    encoded: dict[bytes, Encoded] = field(default_factory=dict)

    @property
    def missing(self) -> list[bytes]:
        return [key for key in self.audio if key not in self.encoded]

    def messages(self) -> list[Message]:
        """The prompt's messages, once nothing is missing."""
        history = (_history_message(t, self.encoded) for t in self.request.history)
        messages = [m for m in history if m is not None]
        codes, features = self.encoded[audio_key(self.request.user_audio)]
        messages.append(Message("user", "audio", audio_tokens=codes, features=features))
        return messages


def _history_message(turn: HistoryTurn, encoded: dict[bytes, Encoded]) -> Message | None:
    if turn.role == "user":
        if turn.audio is not None:
            codes, features = encoded[audio_key(turn.audio)]
            return Message("user", "audio", audio_tokens=codes, features=features)
        return Message("user", "text", text=turn.text) if turn.text else None
    return Message.assistant_reply(turn.text, turn.audio_tokens) if turn.text or turn.audio_tokens else None
