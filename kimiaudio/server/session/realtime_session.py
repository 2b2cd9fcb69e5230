"""One client's conversation, whatever carries it: turn detection, items, responses, events.

The transport (WebRTC in rtc_peer.py, WebSocket in realtime_socket.py) feeds microphone audio
in with `push_audio` (16 kHz), client events with `handle_message`, and gives the session two
things to talk back through: `send` (one JSON event) and a playback (PlaybackTrack's
interface: begin / push / end / flush a response's 24 kHz audio, played samples, and the
playback-started / finished callbacks).

The turn, from the mic to the speaker:
  push_audio -> TurnDetector (VAD thread) -> speech_stopped: the utterance is queued
  (turn_detection none: the client's input_audio_buffer.commit queues the buffered audio)
  -> the turn task: the user turn (with audio) is stored, THEN answered (responder.py):
  submitted to the pipeline, text and audio streamed out, the answer stored; beside it, if the
  session transcribes input, the user's words (input_transcription.py).
The microphone reader never waits on any of this: it only queues. Text items, explicit
commits and response.create pass through the same queue, so they keep their order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np

from kimiaudio.audio import pcm16
from kimiaudio.audio.io import check_speech_input, resample
from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.audio.vad import SpeechStarted, SpeechStopped, TurnDetector
from kimiaudio.config import Config
from kimiaudio.errors import KimiAudioError, StoreUnavailableError
from kimiaudio.server.observe.server_metrics import ServerMetrics
from kimiaudio.server.observe.turn_log import log_response
from kimiaudio.server.session import client_events as ce
from kimiaudio.server.session import events
from kimiaudio.server.session.conversation import Conversation
from kimiaudio.server.session.input_transcription import InputTranscription
from kimiaudio.server.session.owned_tasks import OwnedTasks
from kimiaudio.server.session.queued_turn import QueuedTurn, new_item_id
from kimiaudio.server.session.responder import Responder
from kimiaudio.server.session.session_settings import SessionSettings
from kimiaudio.store import ConversationBusyError

log = logging.getLogger(__name__)


class RealtimeSession:
    def __init__(
        self,
        session_id: str,
        config: Config,
        pipeline,
        store,
        vad,
        vad_executor: Executor,
        conversation_id: str | None,
        send: Callable[[dict], None],
        playback,
        metrics: ServerMetrics | None = None,
        transcribe: bool = False,
    ):
        """transcribe: committed user turns are transcribed until a session.update says otherwise."""
        self.id = session_id
        self._metrics = metrics
        self.pipeline = pipeline
        self.settings = SessionSettings(config, pipeline.can_speak, pipeline.voices, transcribe)
        self.conversation = Conversation(store, conversation_id, session_id)
        self.detector = TurnDetector(vad, self.settings.turn_settings())  # used only in the VAD thread
        self._vad_executor = vad_executor
        self._send = send
        self._ids = events.EventIds()
        self.responder = Responder(self, playback)
        self.transcription = InputTranscription(self)
        self._queue: asyncio.Queue[QueuedTurn] = asyncio.Queue()
        self._buffer: list[np.ndarray] = []  # input audio awaiting an explicit commit (turn_detection none)
        self._speech_item_id: str | None = None  # the item an utterance in progress will become
        self._barge_ins = 0  # speech_started events that interrupted: a queued turn older than the last is moot
        self._creates_waiting = 0  # response.create events queued or starting, not yet a response
        self._cancels = 0  # response.cancel events that found only those: such a response ends as it starts
        self.last_item_id: str | None = None
        self.tasks = OwnedTasks(f"session {session_id}")
        self.closed = False

    @property
    def config(self) -> Config:
        return self.settings.config

    @property
    def response(self):
        return self.responder.current

    @property
    def is_answering(self) -> bool:
        """A response is being generated or played (graceful shutdown waits for these)."""
        return self.response is not None

    def start(self) -> None:
        self.tasks.spawn(self._take_turns(), "turns")

    # ----- events out -----
    def describe(self) -> dict:
        return self.settings.describe(self.id, self.conversation.id)

    def send(self, event: dict) -> None:
        # Counted and logged here, whatever transport carries the session.
        if self._metrics is not None:
            self._metrics.observe_event(event)
        if event["type"] == "response.done":
            log_response(self.id, self.conversation.id, event)
        self._send(self._ids.stamp(event))

    def send_error(self, code: str, message: str, param: str | None = None) -> None:
        self.send(events.error(code, message, param))

    # ----- audio in -----
    async def push_audio(self, pcm: np.ndarray) -> None:
        """16 kHz mono float32 from the microphone. Waits for the VAD only, never for a turn."""
        if self.settings.turn_detection == "none":
            self._buffer_audio(pcm)
            return
        if self.response is not None and not self.config.vad.barge_in:
            return  # half duplex: the assistant is speaking, input is ignored
        loop = asyncio.get_running_loop()
        for event in await loop.run_in_executor(self._vad_executor, self.detector.push, pcm):
            if isinstance(event, SpeechStarted):
                self._speech_item_id = new_item_id()
                self.send(events.speech_started(event.audio_start_ms, self._speech_item_id))
                if self.config.vad.barge_in:
                    self._barge_ins += 1
                    self.responder.interrupt("turn_detected")
            elif isinstance(event, SpeechStopped):
                item_id, self._speech_item_id = self._speech_item_id or new_item_id(), None
                self.send(events.speech_stopped(event.audio_end_ms, item_id))
                self.commit(event.audio, item_id, respond=self.settings.create_response)

    def _buffer_audio(self, pcm: np.ndarray) -> None:
        limit = int(self.config.audio.max_input_seconds * SPEECH_INPUT_RATE)
        if sum(b.size for b in self._buffer) + pcm.size > limit:
            self.send_error(
                "input_audio_buffer_full",
                f"the input audio buffer holds at most "
                f"{self.config.audio.max_input_seconds:g} s (audio.max_input_seconds); commit or clear it",
            )
            return
        self._buffer.append(np.asarray(pcm, dtype=np.float32))

    def commit(self, audio: np.ndarray, item_id: str | None = None, respond: bool = True) -> None:
        """Queue an utterance as the next user turn (the turn task stores and maybe answers it)."""
        self._queue.put_nowait(
            QueuedTurn("audio", item_id or new_item_id(), audio=audio, barge_ins=self._barge_ins, respond=respond)
        )

    def _commit_buffer(self) -> None:
        if self.settings.turn_detection != "none":
            raise ce.ProtocolError(
                "invalid_event",
                "input_audio_buffer.commit: the server's VAD commits turns; set "
                "session.turn_detection to null to commit yourself",
                "type",
            )
        if not self._buffer:
            raise ce.ProtocolError("input_audio_buffer_commit_empty", "input_audio_buffer.commit: the buffer is empty")
        audio, self._buffer = np.concatenate(self._buffer), []
        self.commit(audio, respond=False)

    def _clear_buffer(self) -> None:
        self._buffer = []
        self._vad_executor.submit(self.detector.reset)  # forget an utterance in progress
        self.send(events.buffer_cleared())

    # ----- turns -----
    async def _take_turns(self) -> None:
        while True:
            work = await self._queue.get()
            try:
                if work.kind == "respond":
                    before = self.responder.current
                    try:
                        await self.responder.start(work.request, time.monotonic())
                    finally:
                        self._creates_waiting -= 1
                    started = self.responder.current
                    if started is not None and started is not before and work.cancels != self._cancels:
                        self.responder.interrupt("client_cancelled")  # cancelled while it waited: created, then ended
                    continue
                committed_at = time.monotonic()
                if await self._store_item(work) and work.respond and work.barge_ins == self._barge_ins:
                    # (an utterance overtaken by a later one is kept as history, not answered)
                    await self.responder.start(None, committed_at)
            except Exception as exc:  # this turn fails alone; the next one is still taken
                log.exception("session %s: taking a turn failed", self.id)
                self.send_error("turn_failed", f"the turn could not be answered ({type(exc).__name__})")

    async def _store_item(self, work: QueuedTurn) -> bool:
        """Store a user utterance or a text item (and announce it); False if it was refused."""
        if work.audio is not None:
            try:
                check_speech_input(work.audio, self.config.audio)
            except KimiAudioError as exc:
                self.send_error("invalid_audio", str(exc))
                return False
        await self.responder.settle()
        try:
            if await self.conversation.ensure():
                self.send(events.conversation_created(self.conversation.id))
            if work.role == "assistant":
                index, _ = await self.conversation.add_assistant(work.text, [], [], {}, False, np.zeros(0, np.float32))
            else:
                index, _ = await self.conversation.add_user(work.audio, work.text)
        except StoreUnavailableError as exc:  # the database is away: the session lives on
            log.warning("session %s: the user turn could not be stored: %s", self.id, exc)
            self.send_error("storage_failed", f"the turn could not be stored, so it was not answered ({exc})")
            return False
        except Exception as exc:
            log.exception("session %s: storing the user turn failed", self.id)
            self.send_error("storage_failed", f"the turn could not be stored, so it was not answered ({exc})")
            return False
        previous, self.last_item_id = self.last_item_id, work.item_id
        if work.audio is not None:
            self.send(
                events.committed(
                    self.conversation.id, index, work.audio.size / SPEECH_INPUT_RATE, work.item_id, previous
                )
            )
        self.send(
            events.item_created(
                self.conversation.id,
                events.message_item(work.item_id, work.role, work.text, work.audio is not None, index),
                previous,
            )
        )
        if work.audio is not None:  # its input_audio part follows an input_text part, if any
            self.transcription.start(work.item_id, 1 if work.text else 0, index, work.audio)
        return True

    # ----- client events -----
    async def handle_message(self, message, max_bytes: int = ce.MAX_CLIENT_MESSAGE_BYTES) -> None:
        """One client event (JSON text); anything wrong with it is answered with an error event."""
        try:
            await self.handle_event(ce.parse_client_event(message, max_bytes))
        except ce.ProtocolError as exc:
            self.send_error(exc.code, str(exc), exc.param)
        except KimiAudioError as exc:
            self.send_error("invalid_value", str(exc))
        except Exception:  # a bug: logged once, and the client still hears about it
            log.exception("session %s: handling a client event failed", self.id)
            self.send_error("internal", "the event could not be handled (the details are in the server log)")

    async def handle_event(self, event: ce.ClientEvent) -> None:
        if isinstance(event, ce.AudioAppend):
            rate = self.settings.input_rate
            await self.push_audio(resample(pcm16.to_float(event.pcm16), rate, SPEECH_INPUT_RATE))
        elif isinstance(event, ce.AudioCommit):
            self._commit_buffer()
        elif isinstance(event, ce.AudioClear):
            self._clear_buffer()
        elif isinstance(event, ce.ResponseCancel):
            self._cancel(event.response_id, event.stop_playback)
        elif isinstance(event, ce.ResponseCreate):
            self._creates_waiting += 1
            self._queue.put_nowait(QueuedTurn("respond", "", request=event, cancels=self._cancels))
        elif isinstance(event, ce.ItemCreate):
            self._create_item(event)
        elif isinstance(event, ce.ItemTruncate):
            await self.responder.truncate(event.item_id, event.audio_end_ms)
        elif isinstance(event, ce.ConversationSelect):
            await self._select(event.conversation_id)
        else:
            self.apply_update(event)

    def _cancel(self, response_id: str | None, stop_playback: bool) -> None:
        r = self.responder.current
        if r is not None and not r.cancelled and response_id in (None, r.id):
            self.responder.interrupt("client_cancelled")
        elif self._creates_waiting and response_id is None:
            self._cancels += 1
        elif (
            not stop_playback
        ):  # as OpenAI answers it: a client waiting for a response.done it will never get learns so
            shown = f" with id {response_id[:80]!r}" if response_id is not None else ""
            raise ce.ProtocolError(
                "response_cancel_not_active",
                f"response.cancel: no response{shown} is in progress",
                "response_id" if response_id is not None else None,
            )

    def _create_item(self, event: ce.ItemCreate) -> None:
        item_id = event.item_id or new_item_id()
        if event.pcm16 is not None:
            audio = resample(pcm16.to_float(event.pcm16), self.settings.input_rate, SPEECH_INPUT_RATE)
            self._queue.put_nowait(QueuedTurn("audio", item_id, audio=audio, text=event.text))
        else:  # a system message is context like a user's text (the prompt has no system role)
            role = "assistant" if event.role == "assistant" else "user"
            self._queue.put_nowait(QueuedTurn("text", item_id, text=event.text, role=role))

    def apply_update(self, event: ce.SessionUpdate, announce: bool = True) -> None:
        """session.update: new settings for this session (validated first)."""
        self.settings.apply(event)
        if self.settings.turn_detection == "none":
            self._speech_item_id = None
        # Through the VAD thread, so the change lands between two pushes.
        self._vad_executor.submit(self.detector.configure, self.settings.turn_settings())
        if announce:
            self.send(events.session_updated(self.describe()))

    async def _select(self, conversation_id: str | None) -> None:
        if conversation_id is not None and not await self.conversation.exists(conversation_id):
            raise ce.ProtocolError(
                "conversation_not_found", f"no conversation with id {conversation_id!r}", "conversation_id"
            )
        await self.responder.settle()
        try:
            await self.conversation.select(conversation_id)
        except ConversationBusyError as exc:
            raise ce.ProtocolError(exc.code, str(exc), "conversation_id") from None
        self.last_item_id = None
        self.send(events.session_updated(self.describe()))

    # ----- lifetime -----
    async def close(self) -> None:
        """Cancel the turn in progress (storing what was heard) and stop every task."""
        if self.closed:
            return
        self.closed = True
        try:
            await self.responder.settle()
            await self.conversation.release()
        finally:
            await self.tasks.stop()
