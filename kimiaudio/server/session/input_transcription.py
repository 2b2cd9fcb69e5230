"""The user's words: each committed spoken user turn of a session, transcribed and stored.

While the session's `input_audio_transcription` is set (the page's sessions by default), a
committed user turn is submitted a second time, as the official ASR turn at background
priority (pipeline/transcription.py): the engine batches it beside the answer without taking
the answer's room, and the LM worker reuses the utterance's encoding. When it ends, its text
is stored with the turn (turns.transcript, found by search) and sent as OpenAI sends it,
`conversation.item.input_audio_transcription.completed` (or `.failed`). It runs apart from
the turn queue: an answer never waits for it, nor it for the answer, and a barge-in does not
cancel it (the words were said). Closing the session cancels what is still running.
"""

from __future__ import annotations

import logging

import numpy as np

from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.transcription import transcription_request
from kimiaudio.server.session import events

log = logging.getLogger(__name__)


class InputTranscription:
    def __init__(self, session):
        self.session = session  # RealtimeSession: settings, conversation, pipeline, send, spawn

    def start(self, item_id: str, content_index: int, index: int, audio: np.ndarray) -> None:
        """Transcribe the user turn stored at `index` of the current conversation, if asked to."""
        s = self.session
        if s.settings.transcription is None:
            return
        s.tasks.spawn(self._run(s.conversation.id, item_id, content_index, index, audio), "input transcription")

    async def _run(self, conversation_id: str, item_id: str, content_index: int, index: int, audio: np.ndarray) -> None:
        s = self.session
        try:
            # The server's [sampling], as /v1/audio/transcriptions: a session's answer settings
            # (its token limit, say) are not the words' settings.
            sampling = SamplingParams.from_config(s.pipeline.config.sampling)
            handle = s.pipeline.submit(transcription_request(conversation_id, audio, sampling))
        except KimiAudioError as exc:
            s.send(events.transcription_failed(item_id, content_index, f"the transcription could not start ({exc})"))
            return
        try:
            done = await handle.result()
        finally:
            if handle.done is None:  # the session closed meanwhile
                s.pipeline.cancel(handle)
        if done is None or done.status != "completed":
            reason = (done.error or done.status) if done is not None else "no result"
            s.send(events.transcription_failed(item_id, content_index, f"the transcription failed ({reason})"))
            return
        transcript = done.text.strip()
        try:
            await s.conversation.store_transcript(conversation_id, index, transcript)
        except Exception as exc:  # the client still gets the words; the log says why they were not kept
            log.exception("session %s: storing the transcript of turn %d failed", s.id, index)
            s.send_error("storage_failed", f"the transcript could not be stored ({type(exc).__name__})")
        s.send(events.transcription_completed(item_id, content_index, transcript, audio.size / SPEECH_INPUT_RATE))
