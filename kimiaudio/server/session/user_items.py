"""A session's user items stored and announced: a committed utterance, or a text item
(conversation.item.create), becomes a turn of its conversation before anything answers it.

The item is refused (an `error`, False) when its audio is no usable speech or the store cannot
take it: a turn that is not stored is not answered. A stored one is announced as OpenAI does,
input_audio_buffer.committed for an utterance, then conversation.item.added and .done (its id
chained to the item before it), and an utterance's words are transcribed beside what follows
(input_transcription.py). An item follows the response in progress: an utterance whose speech
interrupted it (barge-in) comes after what was heard of it, any other item after all of it. An
item goes at the end of the conversation (the store only appends): one the client placed
elsewhere (previous_item_id), or whose id is taken, is refused with an `error` naming its event.
"""

from __future__ import annotations

import logging

import numpy as np

from kimiaudio.audio.io import check_speech_input
from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.errors import KimiAudioError
from kimiaudio.server.session import server_events
from kimiaudio.server.session.conversation import Conversation
from kimiaudio.server.session.event_sender import EventSender
from kimiaudio.server.session.input_transcription import InputTranscription
from kimiaudio.server.session.queued_turn import QueuedAudio, QueuedItem, QueuedText
from kimiaudio.server.session.responder import Responder
from kimiaudio.server.session.session_settings import SessionSettings
from kimiaudio.server.session.store_failure import log_store_failure

log = logging.getLogger(__name__)


class UserItems:
    def __init__(
        self,
        settings: SessionSettings,
        conversation: Conversation,
        events: EventSender,
        responder: Responder,
        transcription: InputTranscription,
    ):
        self._settings = settings
        self._conversation = conversation
        self._events = events
        self._responder = responder
        self._transcription = transcription

    async def store(self, work: QueuedItem) -> bool:
        """Store a user utterance or a text item (and announce it); False if it was refused."""
        events, conversation = self._events, self._conversation
        event_id = work.origin.event_id
        audio = work.audio if isinstance(work, QueuedAudio) else None
        utterance = work.utterance if isinstance(work, QueuedAudio) else None
        audio_first = isinstance(work, QueuedAudio) and work.audio_first  # its text came after its audio
        if audio is not None:
            try:
                silence_ok = utterance is not None and utterance.timed_out
                check_speech_input(audio, self._settings.config.audio, silence_ok=silence_ok)
            except KimiAudioError as exc:
                events.error("invalid_audio", str(exc), event_id=event_id)
                return False
        # The item follows the response in progress: what was heard of it, if the utterance
        # interrupted it (barge-in), or all of it, played out.
        await self._responder.settle(interrupt=utterance is not None and utterance.interrupts)
        refused = await self._misplaced(work)
        if refused is not None:
            events.error(*refused, event_id=event_id)
            return False
        role = work.role if isinstance(work, QueuedText) else "user"
        try:
            if await conversation.ensure():
                events.send(server_events.conversation_created(conversation.stored_id))
            if role == "assistant":
                index, _ = await conversation.add_assistant(work.text, [], [], {}, False, np.zeros(0, np.float32))
            else:
                index, user_turn = await conversation.add_user(audio, work.text, audio_first, system=role == "system")
                audio = user_turn.audio  # as stored: what the answer is prompted with, encoded once for both
        except Exception as exc:
            log_store_failure(log, events.session_id, "storing the user turn", exc)
            text = f"the turn could not be stored, so it was not answered ({exc})"
            events.error("storage_failed", text, event_id=event_id)
            return False
        conversation_id = conversation.stored_id
        previous = conversation.next_item(work.item_id, index)
        if audio is not None and utterance is not None:
            seconds = audio.size / SPEECH_INPUT_RATE
            events.send(server_events.committed(conversation_id, index, seconds, work.item_id, previous))
        item = server_events.message_item(
            work.item_id, role, work.text, audio is not None, index, audio_first=audio_first
        )
        events.send(server_events.item_added(conversation_id, item, previous))
        events.send(server_events.item_done(conversation_id, item, previous))
        if audio is not None:  # its input_audio part: after its input_text part, if that came first
            self._transcription.start(work.item_id, 1 if work.text and not audio_first else 0, index, audio)
        return True

    async def _misplaced(self, work: QueuedItem) -> tuple[str, str, str] | None:
        """Why an item cannot go where the client put it -> (code, message, param); None: it
        can. Stored turns only ever grow at the end: an item follows the conversation's last
        one (previous_item_id absent, or naming it), or is its first ("root")."""
        conversation = self._conversation
        where = "conversation.item.create"
        if conversation.has_item(work.item_id):
            return "invalid_value", f"{where}: the conversation has an item {work.item_id!r} already", "item.id"
        previous = work.origin.previous_item_id
        last = conversation.last_item_id
        if previous is None or previous == last:
            return None
        if previous == "root" and (conversation.id is None or await conversation.last_turn() is None):
            return None
        if previous != "root" and not conversation.has_item(previous):
            return "item_not_found", f"{where}: previous_item_id {previous!r}: no such item", "previous_item_id"
        end = f"after {last!r}" if last is not None else "after its stored turns"
        message = f"{where}: previous_item_id {previous!r}: items are added at the end of the conversation ({end})"
        return "unsupported", message, "previous_item_id"
