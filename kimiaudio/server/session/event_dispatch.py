"""A session's protocol front: each client event, parsed (client_events.py), handed to the part
of the session that takes it.

A message that is no event, or an event that is wrong, is answered with an `error` event that
names the client's event_id (a ProtocolError: its code and field; a KimiAudioError:
invalid_value); anything else is a bug, logged, and the client still hears of it (`internal`).
What stops or changes something now is answered at once: audio appended goes to the
microphone's input as the microphone's does (mic_input.py), input_audio_buffer.clear,
response.cancel, a truncate (unless it must wait behind a retrieve or delete: item_edits.py),
session.update (a response.create queued before it keeps the settings it found). What must
keep its order with the items goes through the session's queue (queued_turn.py): a commit's
audio, conversation.item.create, response.create, item retrieve / delete, conversation.select.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from kimiaudio.audio import pcm16
from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.audio.resampling import resample
from kimiaudio.errors import KimiAudioError
from kimiaudio.server.session import client_events
from kimiaudio.server.session.event_fields import ProtocolError
from kimiaudio.server.session.event_sender import EventSender
from kimiaudio.server.session.item_edits import ItemEdits
from kimiaudio.server.session.mic_input import MicInput
from kimiaudio.server.session.queued_turn import (
    ItemOrigin,
    QueuedAudio,
    QueuedSelect,
    QueuedText,
    Utterance,
    new_item_id,
)
from kimiaudio.server.session.response_requests import ResponseRequests
from kimiaudio.server.session.session_settings import SessionSettings
from kimiaudio.server.session.turn_queue import TurnQueue

log = logging.getLogger(__name__)


class EventDispatch:
    def __init__(
        self,
        settings: SessionSettings,
        events: EventSender,
        mic: MicInput,
        requests: ResponseRequests,
        edits: ItemEdits,
        queue: TurnQueue,
        commit: Callable[[np.ndarray, str | None, Utterance | None, str | None], None],
        apply_update: Callable[[client_events.SessionUpdate], None],
    ):
        """queue: the session's turn queue; commit: RealtimeSession.commit (audio, item id,
        utterance, event_id), apply_update: RealtimeSession.apply_update."""
        self._settings = settings
        self._events = events
        self._mic = mic
        self._requests = requests
        self._edits = edits
        self._queue = queue
        self._commit = commit
        self._apply_update = apply_update

    async def handle_message(self, message: str | bytes, max_bytes: int) -> None:
        event_id = None
        try:
            event, event_id = client_events.parse_client_message(message, max_bytes, self._events.shape.webrtc)
            await self.handle_event(event, event_id)
        except ProtocolError as exc:
            self._events.error(exc.code, str(exc), exc.param, exc.event_id or event_id)
        except KimiAudioError as exc:
            self._events.error("invalid_value", str(exc), event_id=event_id)
        except Exception:  # a bug: logged once, and the client still hears about it
            log.exception("session %s: handling a client event failed", self._events.session_id)
            text = "the event could not be handled (the details are in the server log)"
            self._events.error("internal", text, event_id=event_id)

    async def handle_event(self, event: client_events.ClientEvent, event_id: str | None) -> None:
        match event:
            case client_events.AudioAppend(pcm16=data):
                await self._mic.push(self._mic.buffer.to_16k(data, self._settings.input_rate), event_id)
            case client_events.AudioCommit():
                audio, item_id = await self._mic.take_commit()
                self._commit(audio, item_id, None, event_id)  # (no utterance: the client's, stored only)
            case client_events.AudioClear():
                self._mic.clear()
            case client_events.ResponseCancel(response_id=response_id, stop_playback=stop_playback):
                self._requests.cancel(response_id, stop_playback)
            case client_events.ResponseCreate():
                self._queue.put_nowait(self._requests.queued(event, self._settings.snapshot(), event_id))
            case client_events.ItemCreate():
                self._create_item(event, event_id)
            case client_events.ItemTruncate():
                queued = await self._edits.truncate(event, event_id)
                if queued is not None:
                    self._queue.put_nowait(queued)
            case client_events.ItemRetrieve() | client_events.ItemDelete():
                self._queue.put_nowait(self._edits.queued(event, event_id))
            case client_events.ConversationSelect(conversation_id=conversation_id):
                self._queue.put_nowait(QueuedSelect(conversation_id, event_id))
            case client_events.SessionUpdate():
                await self._settings.fetch_voices(event)
                self._apply_update(event)

    def _create_item(self, event: client_events.ItemCreate, event_id: str | None) -> None:
        item_id = event.item_id or new_item_id()
        origin = ItemOrigin(event_id, event.previous_item_id)
        if event.pcm16 is not None:
            audio = resample(pcm16.to_float(event.pcm16), self._settings.input_rate, SPEECH_INPUT_RATE)
            work = QueuedAudio(item_id, audio, text=event.text, origin=origin, audio_first=event.audio_first)
            self._queue.put_nowait(work)
        else:
            self._queue.put_nowait(QueuedText(item_id, event.text, event.role, origin))
