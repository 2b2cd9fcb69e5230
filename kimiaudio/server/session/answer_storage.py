"""A session's answers kept as they are heard: the assistant turns of its conversation.

Nothing heard is lost: the assistant turn is stored when its first audio is played (its first
text sent, for a text answer), marked interrupted, and what was heard since is added at least
every RECORD_INTERVAL_S (`record`, a task beside the response); the final record (everything,
or the heard part of a cut answer, with the speech codes, which the pipeline reports at the
end) replaces it when the response ends (`store_final`): a spoken answer cut short keeps the
text of what was heard (heard_text.py), and an answer cut before anything of it was heard (no
audio played; for a text answer, no text sent) is no turn at all, its progressive record
deleted: the conversation still ends with the user turn it was to answer, and a
response.create answers that again, as an OpenAI client retrying a cancelled response expects.
Its item stays an item the client was told of, with no stored turn (conversation_items.py).
While a spoken answer plays, its record holds the text of what was heard so far, cut as at the
end (heard_text.py) from the text stream's tokens the text deltas carried. A truncate of the
answer playing stores its cut before the client is told of it (`store_cut`), so that a crash
after the event keeps no more than was heard. The user turn an answer follows gets its speech
codes as soon as the pipeline has encoded it (`store_user_codes`).
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from kimiaudio.pipeline.events import TurnDone
from kimiaudio.pipeline.turn_request import HistoryTurn
from kimiaudio.server.session.conversation import Conversation
from kimiaudio.server.session.event_sender import EventSender
from kimiaudio.server.session.heard_text import HeardText
from kimiaudio.server.session.playback import Playback
from kimiaudio.server.session.response_state import ResponseState
from kimiaudio.server.session.store_failure import log_store_failure

log = logging.getLogger(__name__)

RECORD_INTERVAL_S = 1.0  # a playing answer's heard part is stored at least this often


class AnswerStorage:
    def __init__(
        self,
        conversation: Conversation,
        events: EventSender,
        playback: Playback,
        samples_per_code: int | None,
        heard_text: HeardText,
    ):
        """samples_per_code: 24 kHz samples per speech code (None: a text-only server)."""
        self._conversation = conversation
        self._events = events
        self._playback = playback
        self._samples_per_code = samples_per_code
        self._heard_text = heard_text

    async def store_user_codes(self, response: ResponseState, codes: list[int]) -> None:
        try:
            await self._conversation.set_user_codes(response.user_index, response.user_turn, codes)
        except Exception as exc:  # e.g. the conversation was deleted meanwhile: the answer goes on
            log_store_failure(log, self._events.session_id, "storing the user turn's codes", exc)

    async def store_cut(self, response: ResponseState) -> None:
        """A cut answer, still being ended by the pipeline: what was heard of it, stored now
        from what it streamed (its progressive record stopped first, so no write of it lands
        after); its final record follows when it ends."""
        await self.stop_recording(response)
        streamed = TurnDone("cancelled", response.text, list(response.text_tokens), list(response.codes))
        await self.store_final(response, streamed)

    async def stop_recording(self, response: ResponseState) -> None:
        """End the answer's progressive record: a write of it in flight lands before this
        returns, so none lands after the record that follows."""
        response.stop_recording.set()
        if response.recorder is not None:
            await asyncio.wait([response.recorder])

    async def store_final(self, response: ResponseState, done: TurnDone) -> None:
        """The assistant turn's final record: inserted, or the progressive one updated (or
        deleted: nothing of it was heard)."""
        pcm, codes = response.heard(done, self._samples_per_code)
        text, text_tokens, timings = response.text or done.text, list(done.text_tokens), response.timings(done)
        spoken = response.output_type == "both"
        if spoken and response.played_samples is not None:  # cut short: the text of what was heard
            text, text_tokens = self._heard_text.cut(text, text_tokens, len(codes))
        unheard = pcm.size == 0 if spoken else not response.first_heard.is_set()
        try:
            if response.cancelled and unheard:
                if response.stored is not None:
                    await self._conversation.delete_answer(response.item_id, response.stored[0])
                    response.stored = None
            elif response.stored is None:
                await self._insert(response, text, text_tokens, codes, timings, response.cancelled, pcm)
            else:
                index, turn = response.stored
                await self._conversation.update_assistant(
                    index, turn, text, text_tokens, codes, timings, pcm, response.cancelled
                )
        except Exception as exc:
            if log_store_failure(log, self._events.session_id, "storing the assistant turn", exc):
                self._events.error("storage_failed", f"the answer could not be stored ({exc})")

    async def record(self, response: ResponseState) -> None:
        """Store the answer from its first audio played (or text sent) on, marked interrupted,
        and add what was heard at least every RECORD_INTERVAL_S: after a crash, the store holds
        what the user heard, as audio and as the codes of that audio (history after a restart)."""
        loop = asyncio.get_running_loop()
        stop = loop.create_task(response.stop_recording.wait())
        first_heard = loop.create_task(response.first_heard.wait())
        try:  # (the two waits are cancelled however this ends: a cancel before the first audio too)
            await asyncio.wait([stop, first_heard], return_when=asyncio.FIRST_COMPLETED)
            while not response.stop_recording.is_set():
                heard = self._heard_samples(response)
                pcm = response.pcm_between(response.recorded_samples, heard)
                index, turn = response.stored or await self._insert(
                    response, "", [], [], {}, True, np.zeros(0, np.float32)
                )
                heard = max(heard, response.recorded_samples)
                codes = response.codes_heard(heard, self._samples_per_code)
                text = response.text
                if response.output_type == "both":  # the text runs ahead of the audio: what was heard of it
                    text, _ = self._heard_text.cut(text, response.text_tokens, len(codes))
                await self._conversation.record_heard(index, turn, pcm, text, codes)
                response.recorded_samples = heard
                await asyncio.wait([stop], timeout=RECORD_INTERVAL_S)
        except Exception as exc:  # the answer goes on; its final record is attempted at the end
            if log_store_failure(log, self._events.session_id, "storing the answer as it plays", exc):
                self._events.error("storage_failed", f"the answer could not be stored as it played ({exc})")
        finally:
            stop.cancel()
            first_heard.cancel()

    async def _insert(
        self,
        response: ResponseState,
        text: str,
        text_tokens: list[int],
        codes: list[int],
        timings: dict[str, float],
        interrupted: bool,
        pcm: np.ndarray,
    ) -> tuple[int, HistoryTurn]:
        """Insert the assistant turn -> (its index, its history turn); its item's turn from now on."""
        index, turn = await self._conversation.add_assistant(text, text_tokens, codes, timings, interrupted, pcm)
        response.stored = (index, turn)
        self._conversation.items.stored(response.item_id, index)
        return index, turn

    def _heard_samples(self, response: ResponseState) -> int:
        if response.output_type != "both" or self._playback.response_id != response.id:
            return response.recorded_samples
        return min(self._playback.played_samples_24k, response.num_samples)
