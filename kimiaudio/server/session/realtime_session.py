"""One client's conversation, whatever carries it: turn detection, items, responses, events.

A session is built from the server's context (configuration, pipeline, store, VAD thread,
metrics) and what its transport (transport/rtc_peer.py, realtime_socket.py) was admitted with
and gives it: the session id and its VAD, `send` (one JSON event out), a Playback for a
response's 24 kHz audio, and the event shape its client speaks (event_shape.py). The transport
sends session.created first (`send_created`), then feeds microphone audio in with `push_audio`
(16 kHz) and client events with `handle_message` / `handle_event`, which hand each to the
part that takes it (event_dispatch.py).

The turn, from the mic to the speaker:
  push_audio -> MicInput -> TurnDetector (VAD thread) -> speech_stopped: the utterance is queued
  (turn_detection none: the client's input_audio_buffer.commit queues the buffered audio)
  -> the turn task: the user turn (with audio) is stored (user_items.py), THEN answered (responder.py):
  submitted to the pipeline, text and audio streamed out, the answer stored; beside it, if the
  session transcribes input, the user's words (input_transcription.py). A transcription
  session (type "transcription") stores and transcribes its turns and answers none.
The microphone reader never waits on any of this: it only queues. Text items, explicit commits,
response.create, item retrieve / delete (a truncate too, at times: item_edits.py) and
conversation.select share the queue: in order. Closing starts nothing more: the queue stops, the
answer in progress is cut, the entry being taken ends (a user item is stored, no response
starts: turn_queue.py).

While the server stops (SIGTERM), the session counts as answering as long as an answer plays or
anything waits in its queue, so the answers asked for before the stop may finish in the grace;
what is queued after it gets no answer (a response ends failed, `shutting_down`). Closed by the
stop, the session cuts its answer for that reason and says so in a last `error` event.

conversation.select, and the move off a conversation another session took over (the client
told at once, `conversation_lost`; the session leaves it before the next entry is taken), are
the session's conversation moves (conversation_moves.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kimiaudio.audio.vad import TurnDetector
from kimiaudio.errors import StoreUnavailableError
from kimiaudio.server.context import ServerContext
from kimiaudio.server.session import client_events, server_events
from kimiaudio.server.session.conversation import Conversation
from kimiaudio.server.session.conversation_moves import ConversationMoves
from kimiaudio.server.session.event_dispatch import EventDispatch
from kimiaudio.server.session.event_sender import EventSender
from kimiaudio.server.session.event_shape import EventShape
from kimiaudio.server.session.input_transcription import InputTranscription
from kimiaudio.server.session.item_edits import ItemEdits
from kimiaudio.server.session.mic_input import MicInput
from kimiaudio.server.session.out_of_band import OutOfBand
from kimiaudio.server.session.owned_tasks import OwnedTasks
from kimiaudio.server.session.playback import Playback
from kimiaudio.server.session.queued_turn import (
    ItemOrigin,
    QueuedAudio,
    QueuedEdit,
    QueuedItem,
    QueuedLeave,
    QueuedResponse,
    QueuedSelect,
    QueuedText,
    Utterance,
    new_item_id,
)
from kimiaudio.server.session.responder import Responder
from kimiaudio.server.session.response_requests import ResponseRequests
from kimiaudio.server.session.response_state import ResponseState
from kimiaudio.server.session.session_settings import SessionSettings
from kimiaudio.server.session.store_failure import log_store_failure
from kimiaudio.server.session.turn_queue import TurnQueue
from kimiaudio.server.session.user_items import UserItems
from kimiaudio.server.session_registry import Admitted

log = logging.getLogger(__name__)


class RealtimeSession:
    def __init__(
        self,
        context: ServerContext,
        admitted: Admitted,
        send: Callable[[dict[str, Any]], None],
        playback: Playback,
        conversation_id: str | None = None,
        *,
        shape: EventShape,
    ):
        """conversation_id: the stored conversation it continues (None: a new one at its first
        turn); shape: how its client names and shapes events (event_shape.event_shape). It starts
        with the server's settings; the transport applies any others (`apply_update`)."""
        self.id = admitted.session_id
        pipeline = context.pipeline
        self.settings = SessionSettings(context.config, pipeline.can_speak, pipeline.voices)
        self.conversation = Conversation(context.store, conversation_id, self.id, lambda lost: self.moves.lost(lost))
        self.events = EventSender(self.id, lambda: self.conversation.id, send, context.metrics, shape)
        self.tasks = OwnedTasks(f"session {self.id}")
        self.responder = Responder(
            pipeline,
            self.settings,
            self.conversation,
            self.events,
            playback,
            self.tasks,
            context.metrics.note_audio,
            stopping=self._taking_late,
        )
        self.transcription = InputTranscription(pipeline, self.settings, self.conversation, self.events, self.tasks)
        self.items = UserItems(self.settings, self.conversation, self.events, self.responder, self.transcription)
        self.edits = ItemEdits(self.settings, self.conversation, self.events, self.responder, self.transcription)
        detector = TurnDetector(admitted.vad, self.settings.turn_settings())
        self.mic = MicInput(
            self.settings,
            detector,
            context.vad_executor,
            self.events,
            self._speech_started,
            self._utterance,
            self._idle_timeout,
            self._idle_stretch,
        )
        self._queue = TurnQueue(stopping=lambda: context.sessions.is_draining)
        self._barge_ins = 0  # speech_started events that interrupted: a queued turn older than the last is moot
        self._out_of_band = OutOfBand(pipeline, self.conversation, self.events, self.tasks, stopping=self._taking_late)
        self.requests = ResponseRequests(self.responder, self._out_of_band, lambda: self._barge_ins)
        self.moves = ConversationMoves(self.conversation, self.responder, self.events, self._queue, self.describe)
        self._dispatch = EventDispatch(
            self.settings, self.events, self.mic, self.requests, self.edits, self._queue, self.commit, self.apply_update
        )
        self.closed = False

    @property
    def response(self) -> ResponseState | None:
        return self.responder.current

    @property
    def is_answering(self) -> bool:
        """A response (the conversation's, or out of band) is being generated or played, or
        something waits to be taken that may ask for one (the server's stop waits for it)."""
        return self.response is not None or self._queue.busy or self._out_of_band.running

    def _taking_late(self) -> bool:
        """What is being taken came once the server was stopping: it starts no answer."""
        return self._queue.taking_late

    def start(self) -> None:
        self.tasks.spawn(self._take_turns(), "turns")

    def describe(self) -> dict:
        """The session object of session.created / .updated, in the client's shape."""
        return self.events.shape.session(self.settings, self.id, self.conversation.id)

    def send_created(self) -> None:
        """session.created: the first event a client gets, once it can receive events."""
        self.events.send(server_events.session_created(self.describe()))

    # ----- audio in -----
    async def push_audio(self, pcm: np.ndarray, event_id: str | None = None) -> None:
        """16 kHz mono float32 from the microphone (or an input_audio_buffer.append, `event_id`).
        Waits for the VAD only, never for a turn."""
        await self.mic.push(pcm, event_id)

    def _speech_started(self) -> None:
        # Without barge-in (interrupt_response false) the answer goes on, and the speech is
        # the next turn, taken once it has ended.
        if self.settings.config.vad.barge_in:
            self._barge_ins += 1
            self.responder.interrupt("turn_detected")

    def _utterance(self, audio: np.ndarray, item_id: str) -> None:
        barge_in = self.settings.config.vad.barge_in
        self.commit(audio, item_id, Utterance(self._barge_ins, self.settings.answers_commits, barge_in))

    def _idle_timeout(self, audio: np.ndarray, item_id: str) -> None:
        self.commit(audio, item_id, Utterance(self._barge_ins, respond=True, timed_out=True))

    def _idle_stretch(self) -> tuple[int, int] | None:
        """The idle timeout's stretch, named by what ended it (None: not waiting for the user)."""
        responder, queue = self.responder, self._queue
        if responder.current is not None or queue.busy or not responder.ended or self.settings.kind != "realtime":
            return None
        return responder.ended, queue.taken_count

    def commit(
        self,
        audio: np.ndarray,
        item_id: str | None = None,
        utterance: Utterance | None = None,
        event_id: str | None = None,
    ) -> None:
        """Queue an utterance as the next user turn (the turn task stores it, and answers it if
        `utterance` asks; None: the client's commit, stored only)."""
        utterance = utterance if utterance is not None else Utterance(self._barge_ins)
        work = QueuedAudio(item_id or new_item_id(), audio, utterance=utterance, origin=ItemOrigin(event_id))
        self._queue.put_nowait(work)

    # ----- turns -----
    async def _take_turns(self) -> None:
        async for work in self._queue.taken():
            try:
                if self.conversation.in_lost:
                    await self.moves.leave_lost()
                match work:
                    case QueuedResponse():
                        await self.requests.start(work)
                    case QueuedAudio() | QueuedText():
                        await self._take_item(work)
                    case QueuedEdit():
                        await self.edits.take(work)
                    case QueuedSelect():
                        await self.moves.select(work)
                    case QueuedLeave():
                        pass  # left above, before this entry or an earlier one
            except StoreUnavailableError as exc:  # (a read of the store: the database does not answer)
                log_store_failure(log, self.id, f"taking a {type(work).__name__}", exc)
                self.events.error("storage_failed", f"the conversation store does not answer ({exc})")
            except Exception as exc:  # this turn fails alone; the next one is still taken
                log.exception("session %s: taking a turn failed", self.id)
                self.events.error("turn_failed", f"the turn could not be answered ({type(exc).__name__})")

    async def _take_item(self, work: QueuedItem) -> None:
        committed_at = time.monotonic()
        if not await self.items.store(work):
            return
        # An utterance overtaken by a later one is kept as history, not answered.
        utterance = work.utterance if isinstance(work, QueuedAudio) else None
        if (
            utterance is not None
            and utterance.respond
            and utterance.barge_ins == self._barge_ins
            and self.settings.kind == "realtime"
        ):
            await self.responder.start(None, committed_at)
            # Speech that began while it started (behind the answer that speech cut, still
            # being stored) found nothing to cut: the response would play over the user.
            if utterance.barge_ins != self._barge_ins:
                self.responder.interrupt("turn_detected")

    # ----- client events -----
    async def handle_message(
        self, message: str | bytes, max_bytes: int = client_events.MAX_CLIENT_MESSAGE_BYTES
    ) -> None:
        """One client event (JSON text); anything wrong with it is answered with an error event."""
        await self._dispatch.handle_message(message, max_bytes)

    async def handle_event(self, event: client_events.ClientEvent, event_id: str | None = None) -> None:
        """One parsed client event; `event_id`, the client's id for it, names it in any error
        about it, however much later that comes."""
        await self._dispatch.handle_event(event, event_id)

    def apply_update(self, event: client_events.SessionUpdate, announce: bool = True) -> None:
        """session.update: new settings for this session (validated first)."""
        self.settings.apply(event)
        self.mic.configure()
        if announce:
            self.events.send(server_events.session_updated(self.describe()))

    # ----- lifetime -----
    async def close(self, shutdown: bool = False) -> None:
        """Cut the answer in progress (storing what was heard), stop every task, release the
        conversation. `shutdown`: the server stops (the client is told so), else the client left."""
        if self.closed:
            return
        self.closed = self.tasks.closing = True
        self.conversation.closing()
        self._queue.stop()
        try:
            reason = "shutting_down" if shutdown else "client_cancelled"
            await self.responder.settle(reason=reason)
            await self._queue.idle()
            await self._out_of_band.settle(reason)  # (after the queue: the entry being taken may start one)
            if shutdown:
                self.events.error("shutting_down", "the server is shutting down: this session ends")
        finally:
            await self.tasks.stop()
            await self.conversation.release()
