"""The responses a conversation.item.truncate may name: the one in progress, and the newest
that ended in the conversation the session is in (a client says what it played of an answer
after its response.done, too), their items not deleted. A truncate naming anything else, or
past the audio sent (or past an earlier truncate's cut: the item's audio ends there, as
OpenAI's is "already shorter"), is a ProtocolError."""

from __future__ import annotations

import math

from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE
from kimiaudio.server.session.conversation import Conversation
from kimiaudio.server.session.event_fields import ProtocolError
from kimiaudio.server.session.response_state import ResponseState

NUM_TRUNCATABLE = 8  # ended responses a conversation.item.truncate may still name


class Truncatable:
    def __init__(self, conversation: Conversation) -> None:
        self._conversation = conversation  # the session's: which items it has now
        self._ended: dict[str, ResponseState] = {}  # item id -> response, oldest first

    def ended(self, response: ResponseState) -> None:
        self._ended[response.item_id] = response
        if len(self._ended) > NUM_TRUNCATABLE:
            del self._ended[next(iter(self._ended))]

    def forget(self) -> None:
        """The session moved to another conversation: its answers are not in this one."""
        self._ended.clear()

    def named(self, item_id: str, audio_end_ms: int, current: ResponseState | None) -> ResponseState:
        """The response whose item a truncate names (`current`: the one in progress)."""
        response = current if current is not None and current.item_id == item_id else self._ended.get(item_id)
        if response is None or not self._conversation.has_item(item_id):
            raise ProtocolError(
                "item_not_found",
                f"conversation.item.truncate: {item_id!r} is not an assistant item of this "
                f"conversation's last {NUM_TRUNCATABLE} responses in this session",
                "item_id",
            )
        audio_ms, what = math.ceil(response.num_samples * 1000 / SPEECH_OUTPUT_RATE), "sent"
        if response.truncated_ms is not None and response.truncated_ms < audio_ms:
            audio_ms, what = response.truncated_ms, "left by an earlier truncate"
        if audio_end_ms > audio_ms:
            raise ProtocolError(
                "invalid_value",
                f"conversation.item.truncate: audio_end_ms {audio_end_ms} is past the end of "
                f"{item_id!r}'s audio ({audio_ms} ms {what})",
                "audio_end_ms",
            )
        return response
