"""The user's words: each committed spoken user turn of a session, transcribed and stored.

While the session's `input_audio_transcription` is set (WebRTC calls and transcription
sessions by default), a committed user turn is submitted a second time, as the official ASR
turn at background priority (pipeline/transcription.py; the setting's `language` picks its
instruction, its `prompt` is prior text): the engine batches it beside the answer without
taking the answer's room, and the LM worker reuses the utterance's encoding. Its words are
sent as they are generated, `conversation.item.input_audio_transcription.delta`; when it ends
its text is stored with the turn (turns.transcript, found by search) and sent as OpenAI sends
it, `conversation.item.input_audio_transcription.completed` (or `.failed`); both carry the
tokens' logprobs where the session's `include` asks for them. It runs apart
from the turn queue: an answer never waits for it, nor it for the answer, and a barge-in does
not cancel it (the words were said); deleting its item does (`forget`: the words would have
no turn to go to). Closing the session cancels what is still running, and starts no more.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.events import TextDelta
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.pipeline.transcription import transcription_request
from kimiaudio.pipeline.turn_request import TurnRequest
from kimiaudio.server.session import server_events
from kimiaudio.server.session.conversation import Conversation
from kimiaudio.server.session.event_sender import EventSender
from kimiaudio.server.session.owned_tasks import OwnedTasks
from kimiaudio.server.session.session_settings import SessionSettings
from kimiaudio.server.session.store_failure import log_store_failure
from kimiaudio.server.token_logprobs import token_logprobs

log = logging.getLogger(__name__)


class InputTranscription:
    def __init__(
        self,
        pipeline: Pipeline,
        settings: SessionSettings,
        conversation: Conversation,
        events: EventSender,
        tasks: OwnedTasks,
    ):
        self._pipeline = pipeline
        self._settings = settings
        self._conversation = conversation
        self._events = events
        self._tasks = tasks
        self._running: dict[str, asyncio.Task] = {}  # item id -> its transcription, while it runs

    def start(self, item_id: str, content_index: int, index: int, audio: np.ndarray) -> None:
        """Transcribe the user turn stored at `index` of the current conversation, if asked to."""
        conversation_id, setting = self._conversation.id, self._settings.transcription
        if setting is None or conversation_id is None or self._tasks.closing:  # (closing: for nobody)
            return
        # The server's [sampling], as /v1/audio/transcriptions: a session's answer settings
        # (its token limit, say) are not the words' settings.
        sampling = SamplingParams.from_config(self._pipeline.config.sampling)
        logprobs = self._settings.transcription_logprobs
        request = transcription_request(
            conversation_id, audio, sampling, language=setting.language, prompt=setting.prompt, logprobs=logprobs
        )
        seconds = audio.size / SPEECH_INPUT_RATE
        task = self._tasks.spawn(self._run(request, item_id, content_index, index, seconds), "input transcription")
        self._running[item_id] = task

        def ended(done: asyncio.Task) -> None:
            if self._running.get(item_id) is done:  # (not a later item of the same id)
                del self._running[item_id]

        task.add_done_callback(ended)

    def forget(self, item_id: str) -> None:
        """The item was deleted: its transcription, if one runs, is cancelled."""
        task = self._running.pop(item_id, None)
        if task is not None:
            task.cancel()

    async def _run(self, request: TurnRequest, item_id: str, content_index: int, index: int, seconds: float) -> None:
        pipeline, events = self._pipeline, self._events
        try:
            handle = pipeline.submit(request)
        except KimiAudioError as exc:
            failed = f"the transcription could not start ({exc})"
            events.send(server_events.transcription_failed(item_id, content_index, failed))
            return
        try:
            async for event in handle:
                if isinstance(event, TextDelta) and event.text:
                    logprobs = token_logprobs(event.logprobs) if request.logprobs else None
                    events.send(server_events.transcription_delta(item_id, content_index, event.text, logprobs))
            done = handle.done
        finally:
            if handle.done is None:  # the session closed meanwhile
                pipeline.cancel(handle)
        if done is None or done.status != "completed":
            reason = (done.error or done.status) if done is not None else "no result"
            failed = f"the transcription failed ({reason})"
            events.send(server_events.transcription_failed(item_id, content_index, failed))
            return
        transcript = done.text.strip()
        try:
            await self._conversation.store_transcript(request.conversation_id, index, transcript)
        except Exception as exc:  # the client still gets the words; the log says why they were not kept
            if log_store_failure(log, events.session_id, f"storing the transcript of turn {index}", exc):
                events.error("storage_failed", f"the transcript could not be stored ({exc})")
        logprobs = token_logprobs(done.logprobs) if request.logprobs else None
        events.send(server_events.transcription_completed(item_id, content_index, transcript, seconds, logprobs))
