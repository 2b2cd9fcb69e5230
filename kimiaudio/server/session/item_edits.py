"""conversation.item.retrieve and conversation.item.delete: an item of the session's
conversation read back as the server holds it, or taken out of the conversation.

Both name an item the client was told of in this session, in the conversation it is in now
(conversation_items.py); any other id is an `item_not_found` error naming the client's event.
They are taken from the session's queue, in order with the items created before them. A
truncate is answered at once (it stops the answer playing), unless it names an item that a
queued (or running) retrieve or delete names, other than the answer in progress: then it is
queued behind them, so that the client's order holds (after a delete, it names no item). The
answer playing is cut at once whatever waits: what the client hears must stop now.

Retrieve sends conversation.item.retrieved with the item read from the store: a user item's
input_audio part carries the audio as stored (16 kHz), resampled to the session's input rate
as base64 pcm16, and its transcript (null until transcribed); an answer's output_audio part
carries the transcript and the audio that were heard (24 kHz, the output format); an answer
nothing of which was heard has no stored turn, and reads back incomplete and empty. The answer
in progress reads back in progress, with its text and audio so far; one being cut (a barge-in,
a cancel, a truncate) is read back once it is stored, as it is kept. The event names the
conversation (`conversation_id`) and the retrieve's event_id (`client_event_id`): over WebRTC,
one too large for the data channel is an `error` naming both that event_id and the turn's
audio path (transport/rtc_peer.py).

Delete removes the item's stored turn (store/turn_by_index.py: no other turn's index changes,
so an answer being stored meanwhile is stored whole) and the item: no later prompt holds it,
GET /api/conversations/{id} no longer lists it, and its transcription, if one runs, stops.
Two items cannot be deleted while their response is in progress, refused with an error that
says why: the answer itself (its turn is still being stored as it plays) and the user item it
answers (its prompt is built on it); cancelling the response (response.cancel) or waiting for
its response.done makes both deletable.
"""

from __future__ import annotations

import logging
from collections import Counter

from kimiaudio.audio import pcm16
from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.audio.resampling import resample
from kimiaudio.server.session import server_events
from kimiaudio.server.session.client_events import ItemDelete, ItemRetrieve, ItemTruncate
from kimiaudio.server.session.conversation import Conversation
from kimiaudio.server.session.event_fields import ProtocolError
from kimiaudio.server.session.event_sender import EventSender
from kimiaudio.server.session.input_transcription import InputTranscription
from kimiaudio.server.session.queued_turn import QueuedEdit
from kimiaudio.server.session.responder import Responder
from kimiaudio.server.session.response_done import answer_item
from kimiaudio.server.session.response_state import ResponseState
from kimiaudio.server.session.session_settings import SessionSettings
from kimiaudio.server.session.store_failure import log_store_failure
from kimiaudio.store import StoredTurn

log = logging.getLogger(__name__)


class ItemEdits:
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
        self._waiting: Counter[str] = Counter()  # the item ids of queued retrieves and deletes

    def queued(self, request: ItemRetrieve | ItemDelete, event_id: str | None) -> QueuedEdit:
        """The queue's entry for a retrieve or delete."""
        self._waiting[request.item_id] += 1
        return QueuedEdit(request, event_id)

    async def truncate(self, request: ItemTruncate, event_id: str | None) -> QueuedEdit | None:
        """A truncate, answered at once; or, if it names an item other than the answer in
        progress that a queued retrieve or delete names, the queue's entry that takes it after
        them."""
        current = self._responder.current  # (one cancelled already is heard no more)
        playing = current is not None and not current.cancelled and current.item_id == request.item_id
        if self._waiting[request.item_id] > 0 and not playing:
            return QueuedEdit(request, event_id)
        await self._responder.truncate(request.item_id, request.audio_end_ms)
        return None

    async def take(self, work: QueuedEdit) -> None:
        """Answer one queued edit: its event, or an `error` naming its event_id."""
        try:
            match work.request:
                case ItemTruncate(item_id=item_id, audio_end_ms=end_ms):
                    await self._responder.truncate(item_id, end_ms)
                case ItemRetrieve(item_id=item_id):
                    conversation_id = self._conversation.id  # (the one its turn is read from)
                    item = await self._retrieved(item_id)
                    self._events.send(server_events.item_retrieved(item, conversation_id, work.event_id))
                case ItemDelete(item_id=item_id):
                    await self._delete(item_id, work.event_id)
        except ProtocolError as exc:
            self._events.error(exc.code, str(exc), exc.param, work.event_id)
        finally:  # (only now: a truncate that comes while it runs still waits for it)
            if not isinstance(work.request, ItemTruncate):
                self._waiting[work.request.item_id] -= 1

    def _known(self, item_id: str, where: str) -> None:
        if not self._conversation.has_item(item_id):
            raise ProtocolError(
                "item_not_found",
                f"{where}: {item_id[:80]!r} is not an item of this conversation that this session was told of",
                "item_id",
            )

    async def _retrieved(self, item_id: str) -> dict:
        where = "conversation.item.retrieve"
        self._known(item_id, where)
        response = self._responder.current
        if response is not None and response.item_id == item_id and response.cancelled:
            await self._responder.settle(interrupt=False)  # cut, being stored: read back what it keeps
            self._known(item_id, where)
        elif response is not None and response.item_id == item_id:
            return self._in_progress(response)
        try:
            turn = await self._conversation.stored_item(item_id)
        except Exception as exc:  # (the database away, a stored blob that does not decode)
            log_store_failure(log, self._events.session_id, "reading an item's turn", exc)
            raise ProtocolError("storage_failed", f"{where}: {item_id!r} could not be read ({exc})") from None
        if turn is None:  # an answer nothing of which was heard (cut, or failed, before its first audio)
            return {**server_events.message_item(item_id, "assistant", status="incomplete"), "content": []}
        return self._item(item_id, turn)

    @staticmethod
    def _in_progress(response: ResponseState) -> dict:
        """The answer being generated, with what it has so far: its text, and its audio."""
        item = answer_item(response, "in_progress", response.stored[0] if response.stored else None)
        if response.output_type == "both":
            audio = response.pcm_between(0, response.num_samples)
            part = {
                "type": "output_audio",
                "transcript": response.text,
                "audio": pcm16.to_base64(pcm16.to_bytes(audio)),
            }
        else:
            part = {"type": "output_text", "text": response.text}
        return {**item, "content": [part]}

    def _item(self, item_id: str, turn: StoredTurn) -> dict:
        has_audio = turn.audio is not None
        status = "incomplete" if turn.interrupted else "completed"
        item = server_events.message_item(
            item_id, turn.role, turn.text, has_audio, turn.index, turn.interrupted, status, turn.audio_first
        )
        for part in item["content"]:
            if part["type"] == "input_audio" and turn.audio is not None:
                audio = resample(turn.audio, SPEECH_INPUT_RATE, self._settings.input_rate)
                part.update(audio=pcm16.to_base64(pcm16.to_bytes(audio)), transcript=turn.transcript)
            elif part["type"] == "output_audio" and turn.audio is not None:
                part["audio"] = pcm16.to_base64(pcm16.to_bytes(turn.audio))  # 24 kHz, as stored
        return item

    async def _delete(self, item_id: str, event_id: str | None) -> None:
        where = "conversation.item.delete"
        self._known(item_id, where)
        response = self._responder.current
        if response is not None and response.cancelled:  # ending: what it stores decides what is left
            await self._responder.settle(interrupt=False)
            self._known(item_id, where)
            response = self._responder.current
        if response is not None:
            wait = "cancel it (response.cancel) or wait for its response.done, then delete it"
            if response.item_id == item_id:
                raise ProtocolError(
                    "conversation_already_has_active_response",
                    f"{where}: {item_id!r} is the answer of response {response.id}, in progress; {wait}",
                    "item_id",
                )
            if self._conversation.items.index(item_id) == response.user_index:
                raise ProtocolError(
                    "conversation_already_has_active_response",
                    f"{where}: {item_id!r} is being answered by response {response.id}, in progress; {wait}",
                    "item_id",
                )
        self._transcription.forget(item_id)  # (first: its words must not be written into a turn going away)
        try:
            await self._conversation.delete_item(item_id)
        except Exception as exc:
            log_store_failure(log, self._events.session_id, "deleting an item's turn", exc)
            message = f"{where}: {item_id!r} could not be deleted ({exc})"
            self._events.error("storage_failed", message, event_id=event_id)
            return
        self._events.send(server_events.item_deleted(item_id))
