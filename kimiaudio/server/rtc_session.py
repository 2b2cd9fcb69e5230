"""One real-time client: its RTCPeerConnection, turn detection, responses and events.

Follows aiortc's examples/server: one RTCPeerConnection per client, every handler registered
before setRemoteDescription, no trickle ICE (aiortc's setLocalDescription returns once ICE
gathering is complete), closed when the connection fails or closes.

The turn, from the mic to the speaker:
  incoming track -> PyAV resampler (any rate/layout -> 16 kHz mono float) -> TurnDetector
  -> speech_stopped: the user turn (with audio) is stored, THEN submitted to the pipeline
  -> TextDelta -> response.text.delta; AudioChunk -> PlaybackTrack (jitter buffer, 48 kHz)
  -> TurnDone: the assistant turn is stored; response.done once playback has drained.
Barge-in (speech_started while a response is generating or playing) and response.cancel
flush the playback at once, cancel the pipeline turn, and store the assistant turn marked
interrupted and truncated to the audio that was actually played.

A client that vanishes is noticed by its audio stopping (no frame for INPUT_TIMEOUT_S) or by
the connection state; closing cancels its turn and tasks and frees its slot.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import secrets
import time
from concurrent.futures import Executor
from typing import Any, Callable

import av
import numpy as np
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from kimiaudio.audio.io import check_speech_input
from kimiaudio.audio.vad import SileroVad, SpeechStarted, SpeechStopped, TurnDetector, TurnSettings
from kimiaudio.config import Config, apply_overrides
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.request import HistoryTurn, TurnRequest
from kimiaudio.pipeline.events import AudioChunk, TextDelta, TurnDone, UserEncoded
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.server import events
from kimiaudio.server.audio_track import PlaybackTrack
from kimiaudio.server.response import Response
from kimiaudio.store import ConversationStore

log = logging.getLogger(__name__)

INPUT_TIMEOUT_S = 4.0  # no audio frame for this long: the client is gone
FIRST_FRAME_TIMEOUT_S = 20.0  # ICE + DTLS setup may take a while over the internet
CANCEL_GRACE_S = 3.0  # how long a cancelled pipeline turn may take to report TurnDone


def _vad_settings(config: Config) -> TurnSettings:
    v = config.vad
    return TurnSettings(v.threshold, v.min_speech_ms, v.silence_ms, v.prefix_padding_ms, config.audio.max_input_seconds)


class RtcSession:
    def __init__(self, session_id: str, config: Config, pipeline, store: ConversationStore, vad: SileroVad,
                 vad_executor: Executor, conversation_id: str | None, on_closed: Callable[["RtcSession"], None]):
        self.id = session_id
        self.config = copy.deepcopy(config)  # session.update changes this copy only
        self.output_type = "both"
        self.pipeline, self.store = pipeline, store
        self.conversation_id = conversation_id
        self._history: list[HistoryTurn] | None = None  # loaded lazily from the store
        self._on_closed = on_closed
        ice = [RTCIceServer(urls=url) for url in config.server.ice_servers]
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=ice))
        self.track = PlaybackTrack(on_playback_started=self._playback_started,
                                   on_playback_finished=self._playback_finished)
        self.detector = TurnDetector(vad, _vad_settings(self.config))  # used only in the VAD thread
        self._vad_executor = vad_executor
        self.response: Response | None = None
        self._ids = events.EventIds()
        self._channel = None
        self._outbox: list[dict] = []  # events sent before the data channel opened
        self._tasks: set[asyncio.Task] = set()
        self._has_audio_track = False
        self.closed = False

    # ----- signalling -----
    async def accept(self, offer: RTCSessionDescription) -> RTCSessionDescription:
        """Answer the client's offer (handlers first, then the descriptions)."""
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("connectionstatechange", self._on_connection_state)
        await self.pc.setRemoteDescription(offer)
        if not self._has_audio_track:
            raise KimiAudioError("the offer has no audio track: send the microphone with the offer")
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        return self.pc.localDescription

    def _on_track(self, track) -> None:
        if track.kind != "audio" or self._has_audio_track:
            return
        self._has_audio_track = True
        self.pc.addTrack(self.track)
        self._spawn(self._read_audio(track), "audio input")

    def _on_datachannel(self, channel) -> None:
        if self._channel is not None:
            return
        self._channel = channel
        channel.on("message", lambda message: self._spawn(self._on_message(message), "client event"))
        self.send(events.session_created(self.id, self.conversation_id, self.settings()))
        outbox, self._outbox = self._outbox, []
        for event in outbox:
            self._send_now(event)

    def _on_connection_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self._spawn(self.close(), "close")

    # ----- events out -----
    def settings(self) -> dict[str, Any]:
        return {"vad": dataclasses.asdict(self.config.vad), "sampling": dataclasses.asdict(self.config.sampling),
                "output_type": self.output_type}

    def send(self, event: dict) -> None:
        event = self._ids.stamp(event)
        if self._channel is None or self._channel.readyState != "open":
            if len(self._outbox) < 1000:
                self._outbox.append(event)
            return
        self._send_now(event)

    def _send_now(self, event: dict) -> None:
        try:
            self._channel.send(json.dumps(event))
        except Exception as exc:  # the channel went away under us; closing will follow
            log.debug("session %s: could not send %s: %s", self.id, event["type"], exc)

    # ----- audio in -----
    async def _read_audio(self, track) -> None:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=16000)
        loop = asyncio.get_running_loop()
        timeout = FIRST_FRAME_TIMEOUT_S
        try:
            while True:
                try:
                    frame = await asyncio.wait_for(track.recv(), timeout)
                except asyncio.TimeoutError:
                    log.info("session %s: no audio for %.0f s, closing", self.id, timeout)
                    break
                except MediaStreamError:
                    break
                timeout = INPUT_TIMEOUT_S
                for out in resampler.resample(frame):
                    pcm = out.to_ndarray().reshape(-1)  # [n] float32 16 kHz
                    if self.response is not None and not self.config.vad.barge_in:
                        continue  # half duplex: the assistant is speaking, input is ignored
                    for turn_event in await loop.run_in_executor(self._vad_executor, self.detector.push, pcm):
                        await self._on_turn_event(turn_event)
        finally:
            self._spawn(self.close(), "close")

    async def _on_turn_event(self, event) -> None:
        if isinstance(event, SpeechStarted):
            self.send(events.speech_started(event.audio_start_ms))
            if self.response is not None:
                self.interrupt()
        elif isinstance(event, SpeechStopped):
            self.send(events.speech_stopped(event.audio_end_ms))
            await self.commit(event.audio)

    # ----- turns -----
    async def commit(self, audio: np.ndarray) -> None:
        """Store the user turn (with its audio), then start the response."""
        committed_at = time.monotonic()
        try:
            check_speech_input(audio, self.config.audio)
        except KimiAudioError as exc:
            self.send(events.error("invalid_audio", str(exc)))
            return
        await self._settle_response()
        try:
            conversation_id = await self._conversation()
            history = await self._load_history()
            seconds = audio.size / 16000
            index = await self.store.add_turn(conversation_id, "user", audio=audio, timings={"speech_s": seconds})
        except Exception as exc:
            log.exception("session %s: storing the user turn failed", self.id)
            self.send(events.error("storage_failed", f"the turn could not be stored, so it was not answered ({exc})"))
            return
        self.send(events.committed(conversation_id, index, seconds))
        self.send(events.item_created(conversation_id, {"index": index, "role": "user", "text": "",
                                                        "interrupted": False, "has_audio": True}))
        request = TurnRequest(conversation_id=conversation_id, history=list(history), user_audio=audio,
                              sampling=SamplingParams.from_config(self.config.sampling), output_type=self.output_type)
        user_turn = HistoryTurn(role="user", audio=audio)
        history.append(user_turn)
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
        self.track.begin(response.id)
        self.send(events.response_created(response.id, conversation_id))
        response.task = self._spawn(self._run_response(response), "response")

    async def _run_response(self, r: Response) -> None:
        done: TurnDone | None = None
        try:
            async for event in r.handle:
                if isinstance(event, UserEncoded):
                    r.user_turn.audio_tokens = list(event.audio_tokens)
                    await self._store_user_codes(r, event.audio_tokens)
                elif isinstance(event, TextDelta) and event.text:
                    r.text += event.text
                    if not r.cancelled:
                        self.send(events.text_delta(r.id, event.text))
                elif isinstance(event, AudioChunk):
                    r.pcm.append(np.asarray(event.pcm, dtype=np.float32).reshape(-1))
                    if not r.cancelled:
                        self.track.push(r.pcm[-1])
                elif isinstance(event, TurnDone):
                    done = event
        except asyncio.CancelledError:
            pass  # the pipeline did not report in time after a cancel: finish with what we have
        except Exception as exc:
            log.exception("session %s: response %s failed", self.id, r.id)
            done = TurnDone(status="failed", text=r.text, error=f"{type(exc).__name__}: {exc}")
        r.generation_ended = True
        if done is None:
            done = TurnDone(status="cancelled", text=r.text)
        if not r.cancelled:
            self.track.end()
        await self._finish_response(r, done)

    async def _finish_response(self, r: Response, done: TurnDone) -> None:
        if done.status == "failed" and not r.cancelled:
            self.track.flush()
        elif not r.cancelled:
            await self._store_assistant(r, done)  # stored as soon as generation ends
            if self.track.is_consumed:
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
            await self.store.update_turn(self.conversation_id, r.user_index, audio_tokens=codes)
        except Exception:  # e.g. the conversation was deleted meanwhile: the answer goes on
            log.exception("session %s: storing the user turn's codes failed", self.id)

    async def _store_assistant(self, r: Response, done: TurnDone) -> None:
        """Insert the assistant turn when generation ends; after a cut-in, mark it interrupted."""
        pcm, tokens = r.heard(done, self.pipeline.samples_per_code)
        text, timings = r.text or done.text, r.timings(done)
        try:
            if r.stored_index is None:
                r.stored_index = await self.store.add_turn(
                    self.conversation_id, "assistant", text, text_tokens=list(done.text_tokens), audio_tokens=tokens,
                    timings=timings, interrupted=r.cancelled, audio=pcm)
                self.send(events.item_created(self.conversation_id, {
                    "index": r.stored_index, "role": "assistant", "text": text,
                    "interrupted": r.cancelled, "has_audio": pcm.size > 0}))
                r.history_turn = HistoryTurn(role="assistant", text=text, audio_tokens=tokens)
                self._history.append(r.history_turn)
            else:
                await self.store.update_turn(self.conversation_id, r.stored_index, interrupted=True,
                                             audio_tokens=tokens, timings=timings, audio=pcm)
                r.history_turn.audio_tokens = tokens
        except Exception:
            log.exception("session %s: storing the assistant turn failed", self.id)

    def interrupt(self) -> None:
        """Barge-in / response.cancel: silence now, cancel generation, keep what was heard."""
        r = self.response
        if r is None or r.cancelled:
            return
        r.cancelled = True
        r.played_samples = self.track.flush()
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

    # ----- conversations -----
    async def _conversation(self) -> str:
        if self.conversation_id is None:
            self.conversation_id = (await self.store.create_conversation())["id"]
            self._history = []
            self.send(events.conversation_created(self.conversation_id))
        return self.conversation_id

    async def _load_history(self) -> list[HistoryTurn]:
        if self._history is None:
            stored = await self.store.load_history(self.conversation_id) or []
            self._history = [HistoryTurn(role=t.role, text=t.text, audio_tokens=t.audio_tokens,
                                         audio=t.audio if t.role == "user" else None) for t in stored]
        return self._history

    # ----- client events -----
    async def _on_message(self, message) -> None:
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
        self.config = config
        if event.output_type is not None:
            self.output_type = event.output_type
        # Through the VAD thread, so the change lands between two pushes.
        self._vad_executor.submit(self.detector.configure, _vad_settings(config))
        if announce:
            self.send(events.session_updated(self.id, self.conversation_id, self.settings()))

    async def _select(self, conversation_id: str | None) -> None:
        if conversation_id is not None and await self.store.get_conversation(conversation_id) is None:
            raise events.ProtocolError("conversation_not_found", f"no conversation with id {conversation_id!r}")
        await self._settle_response()
        self.conversation_id, self._history = conversation_id, (None if conversation_id else [])
        if conversation_id is not None:
            await self._load_history()
        self.send(events.session_updated(self.id, self.conversation_id, self.settings()))

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
        """Cancel the turn in progress (storing what was heard), stop every task, close the peer."""
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
            self.track.stop()
            await self.pc.close()
            self._on_closed(self)
            log.info("session %s closed", self.id)
