"""One client's conversation, whatever carries it: turn detection, responses, settings, events.

The transport (WebRTC in rtc_session.py) feeds microphone audio in with `push_audio`, client
events with `handle_message`, and gives the session two things to talk back through: `send`
(one JSON event) and a playback (PlaybackTrack: begin / push / end / flush a response's
24 kHz audio, and tell the session when playing started and finished).

The turn, from the mic to the speaker:
  push_audio (16 kHz) -> TurnDetector (VAD thread) -> speech_stopped: the utterance is queued
  -> the turn task: the user turn (with audio) is stored, THEN submitted to the pipeline
  -> TextDelta -> response.text.delta; AudioChunk -> playback
  -> TurnDone: the assistant turn is stored; response.done once playback has drained.
The microphone reader never waits on any of this: it only queues. Barge-in (speech_started
while a response is generating or playing) and response.cancel flush the playback at once,
cancel the pipeline turn, and store the assistant turn marked interrupted and truncated to the
audio that was actually played.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import secrets
import time
from concurrent.futures import Executor
from typing import Any, Callable

import numpy as np

from kimiaudio.audio.io import check_speech_input
from kimiaudio.audio.vad import SpeechStarted, SpeechStopped, TurnDetector, TurnSettings
from kimiaudio.config import Config, apply_overrides
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.events import AudioChunk, TextDelta, TurnDone, UserEncoded
from kimiaudio.pipeline.request import TurnRequest
from kimiaudio.server import events
from kimiaudio.server.conversation import Conversation
from kimiaudio.server.response import Response

log = logging.getLogger(__name__)

CANCEL_GRACE_S = 3.0  # how long a cancelled pipeline turn may take to report TurnDone


def vad_settings(config: Config) -> TurnSettings:
    v = config.vad
    return TurnSettings(v.threshold, v.min_speech_ms, v.silence_ms, v.prefix_padding_ms, config.audio.max_input_seconds)


class RealtimeSession:
    def __init__(self, session_id: str, config: Config, pipeline, store, vad, vad_executor: Executor,
                 conversation_id: str | None, send: Callable[[dict], None], playback):
        self.id = session_id
        self.config = copy.deepcopy(config)  # session.update changes this copy only
        self.pipeline = pipeline
        self.output_type = "both" if pipeline.can_speak else "text"
        self.conversation = Conversation(store, conversation_id)
        self.detector = TurnDetector(vad, vad_settings(self.config))  # used only in the VAD thread
        self._vad_executor = vad_executor
        self._send = send
        self.playback = playback
        playback.on_playback_started, playback.on_playback_finished = self._playback_started, self._playback_finished
        self.response: Response | None = None
        self._ids = events.EventIds()
        self._commits: asyncio.Queue[tuple[np.ndarray, int]] = asyncio.Queue()
        self._barge_ins = 0  # speech_started events that interrupted: a queued turn older than the last is moot
        self._tasks: set[asyncio.Task] = set()
        self.closed = False

    def start(self) -> None:
        self._spawn(self._take_turns(), "turns")

    # ----- events out -----
    def settings(self) -> dict[str, Any]:
        return {"vad": dataclasses.asdict(self.config.vad), "sampling": dataclasses.asdict(self.config.sampling),
                "output_type": self.output_type, "can_speak": self.pipeline.can_speak}

    def send(self, event: dict) -> None:
        self._send(self._ids.stamp(event))

    # ----- audio in -----
    async def push_audio(self, pcm: np.ndarray) -> None:
        """16 kHz mono float32 from the microphone. Waits for the VAD only, never for a turn."""
        if self.response is not None and not self.config.vad.barge_in:
            return  # half duplex: the assistant is speaking, input is ignored
        loop = asyncio.get_running_loop()
        for event in await loop.run_in_executor(self._vad_executor, self.detector.push, pcm):
            if isinstance(event, SpeechStarted):
                self.send(events.speech_started(event.audio_start_ms))
                if self.config.vad.barge_in:
                    self._barge_ins += 1
                    self.interrupt()
            elif isinstance(event, SpeechStopped):
                self.send(events.speech_stopped(event.audio_end_ms))
                self.commit(event.audio)

    def commit(self, audio: np.ndarray) -> None:
        """Queue an utterance as the next user turn (the turn task stores and answers it)."""
        self._commits.put_nowait((audio, self._barge_ins))

    # ----- turns -----
    async def _take_turns(self) -> None:
        while True:
            audio, barge_ins = await self._commits.get()
            try:
                await self._take_turn(audio, barge_ins, time.monotonic())
            except Exception as exc:  # this turn fails alone; the next one is still taken
                log.exception("session %s: taking a turn failed", self.id)
                self.send(events.error("turn_failed", f"the turn could not be answered ({type(exc).__name__})"))

    async def _take_turn(self, audio: np.ndarray, barge_ins: int, committed_at: float) -> None:
        """Store the user turn (with its audio), then start the response."""
        try:
            check_speech_input(audio, self.config.audio)
        except KimiAudioError as exc:
            self.send(events.error("invalid_audio", str(exc)))
            return
        await self._settle_response()
        try:
            if await self.conversation.ensure():
                self.send(events.conversation_created(self.conversation.id))
            index, user_turn = await self.conversation.add_user(audio)
        except Exception as exc:
            log.exception("session %s: storing the user turn failed", self.id)
            self.send(events.error("storage_failed", f"the turn could not be stored, so it was not answered ({exc})"))
            return
        conversation_id = self.conversation.id
        self.send(events.committed(conversation_id, index, audio.size / 16000))
        self.send(events.item_created(conversation_id, {"index": index, "role": "user", "text": "",
                                                        "interrupted": False, "has_audio": True}))
        if barge_ins != self._barge_ins:
            return  # the user spoke again meanwhile: that utterance is answered, with this one as history
        history = (await self.conversation.history())[:-1]
        request = TurnRequest(conversation_id=conversation_id, history=list(history), user_audio=audio,
                              sampling=SamplingParams.from_config(self.config.sampling), output_type=self.output_type)
        try:
            handle = self.pipeline.submit(request)
        except Exception as exc:
            if not isinstance(exc, KimiAudioError):
                log.exception("session %s: submitting the turn failed", self.id)
            self.send(events.error("response_failed", f"the turn could not be started ({exc})"))
            return
        response = Response(f"resp_{secrets.token_hex(6)}", handle, index, user_turn, committed_at,
                            playback_done=asyncio.get_running_loop().create_future())
        self.response = response
        if self.output_type == "both":
            self.playback.begin(response.id)
        self.send(events.response_created(response.id, conversation_id))
        response.task = self._spawn(self._run_response(response), "response")

    async def _run_response(self, r: Response) -> None:
        done: TurnDone | None = None
        try:
            async for event in r.handle:
                if isinstance(event, UserEncoded):
                    await self._store_user_codes(r, event.audio_tokens)
                elif isinstance(event, TextDelta) and event.text:
                    r.text += event.text
                    if not r.cancelled:
                        self.send(events.text_delta(r.id, event.text))
                elif isinstance(event, AudioChunk):
                    r.pcm.append(np.asarray(event.pcm, dtype=np.float32).reshape(-1))
                    if not r.cancelled:
                        self.playback.push(r.pcm[-1])
                elif isinstance(event, TurnDone):
                    done = event
        except asyncio.CancelledError:
            pass  # the pipeline did not report in time after a cancel: finish with what we have
        except Exception as exc:  # a bug here must still end the response for the client
            log.exception("session %s: response %s failed", self.id, r.id)
            self.pipeline.cancel(r.handle)
            done = TurnDone(status="failed", text=r.text, error=f"{type(exc).__name__}: {exc}")
        r.generation_ended = True
        if done is None:
            done = TurnDone(status="cancelled", text=r.text)
        if not r.cancelled and self.output_type == "both":
            self.playback.end()
        await self._finish_response(r, done)

    async def _finish_response(self, r: Response, done: TurnDone) -> None:
        if done.status == "failed" and not r.cancelled:
            self.playback.flush()
        elif not r.cancelled:
            await self._store_assistant(r, done)  # stored as soon as generation ends
            if r.pcm and self.playback.is_consumed:
                try:  # cut short by interrupt(); bounded in case nobody is receiving
                    await asyncio.wait_for(asyncio.shield(r.playback_done), r.audio_seconds + 5.0)
                except asyncio.TimeoutError:
                    pass
        if r.cancelled:
            await self._store_assistant(r, done)  # insert or update: interrupted, truncated
        status = "cancelled" if r.cancelled else done.status
        self.send(events.response_done(r.id, status, r.text or done.text, r.timings(done), done.error,
                                       prefill_tokens_cached=done.prefill_tokens_cached,
                                       prefill_tokens_computed=done.prefill_tokens_computed))
        if self.response is r:
            self.response = None

    async def _store_user_codes(self, r: Response, codes: list[int]) -> None:
        try:
            await self.conversation.set_user_codes(r.user_index, r.user_turn, codes)
        except Exception:  # e.g. the conversation was deleted meanwhile: the answer goes on
            log.exception("session %s: storing the user turn's codes failed", self.id)

    async def _store_assistant(self, r: Response, done: TurnDone) -> None:
        """Insert the assistant turn when generation ends; after a cut-in, mark it interrupted."""
        pcm, codes = r.heard(done, self.pipeline.samples_per_code)
        text, timings = r.text or done.text, r.timings(done)
        try:
            if r.stored is None:
                index, turn = await self.conversation.add_assistant(text, list(done.text_tokens), codes, timings,
                                                                    r.cancelled, pcm)
                r.stored = (index, turn)
                self.send(events.item_created(self.conversation.id, {
                    "index": index, "role": "assistant", "text": text,
                    "interrupted": r.cancelled, "has_audio": pcm.size > 0}))
            else:
                await self.conversation.update_assistant(*r.stored, codes, timings, pcm)
        except Exception as exc:
            log.exception("session %s: storing the assistant turn failed", self.id)
            self.send(events.error("storage_failed", f"the answer could not be stored ({exc})"))

    def interrupt(self) -> None:
        """Barge-in / response.cancel: silence now, cancel generation, keep what was heard."""
        r = self.response
        if r is None or r.cancelled:
            return
        r.cancelled = True
        r.played_samples = self.playback.flush()
        self.pipeline.cancel(r.handle)
        if not r.playback_done.done():
            r.playback_done.set_result(None)
        if r.task is not None:
            # Only the wait for the pipeline's TurnDone is cut short, never the storing.
            asyncio.get_running_loop().call_later(
                CANCEL_GRACE_S, lambda: None if r.generation_ended else r.task.cancel())

    async def _settle_response(self) -> None:
        """Interrupt any response in progress and wait until it is stored."""
        r = self.response
        if r is not None:
            self.interrupt()
            if r.task is not None:
                await asyncio.wait([r.task], timeout=CANCEL_GRACE_S + 1.0)

    def _playback_started(self, response_id: str) -> None:
        r = self.response
        if r is not None and r.id == response_id:
            r.first_played_at = time.monotonic()
            self.send(events.audio_started(response_id))

    def _playback_finished(self, response_id: str) -> None:
        r = self.response
        if r is not None and r.id == response_id and not r.playback_done.done():
            r.playback_done.set_result(None)

    # ----- client events -----
    async def handle_message(self, message) -> None:
        try:
            event = events.parse_client_event(message)
            if isinstance(event, events.ResponseCancel):
                self.interrupt()
            elif isinstance(event, events.ConversationSelect):
                await self._select(event.conversation_id)
            else:
                self.apply_update(event)
        except events.ProtocolError as exc:
            self.send(events.error(exc.code, str(exc)))
        except KimiAudioError as exc:
            self.send(events.error("invalid_value", str(exc)))

    def apply_update(self, event: events.SessionUpdate, announce: bool = True) -> None:
        """session.update: new VAD / sampling settings for this session (validated first)."""
        config = copy.deepcopy(self.config)
        apply_overrides(config, {k: v for k, v in (("vad", event.vad), ("sampling", event.sampling)) if v})
        SamplingParams.from_config(config.sampling)  # validates ranges before anything changes
        if event.output_type == "both" and not self.pipeline.can_speak:
            raise KimiAudioError("session.output_type: this server answers in text only (model.text_only = true)")
        self.config = config
        if event.output_type is not None:
            self.output_type = event.output_type
        # Through the VAD thread, so the change lands between two pushes.
        self._vad_executor.submit(self.detector.configure, vad_settings(config))
        if announce:
            self.send(events.session_updated(self.id, self.conversation.id, self.settings()))

    async def _select(self, conversation_id: str | None) -> None:
        if conversation_id is not None and not await self.conversation.exists(conversation_id):
            raise events.ProtocolError("conversation_not_found", f"no conversation with id {conversation_id!r}")
        await self._settle_response()
        await self.conversation.select(conversation_id)
        self.send(events.session_updated(self.id, self.conversation.id, self.settings()))

    # ----- lifetime -----
    def _spawn(self, coro, what: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)

        def finished(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("session %s: %s failed", self.id, what, exc_info=t.exception())

        task.add_done_callback(finished)
        return task

    async def close(self) -> None:
        """Cancel the turn in progress (storing what was heard) and stop every task."""
        if self.closed:
            return
        self.closed = True
        try:
            await self._settle_response()
        finally:
            current = asyncio.current_task()
            for task in list(self._tasks):
                if task is not current:
                    task.cancel()
