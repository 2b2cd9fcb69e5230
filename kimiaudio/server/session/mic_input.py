"""A session's microphone side: audio into the server's VAD (turn detection), or, with turn
detection off, into the input buffer the client commits itself; either way through the
session's noise reduction first, when it asks for one (as OpenAI's filters what is appended
before its VAD and model hear it).

The VAD's detector and the noise reducer live in the VAD thread: every call to either goes
through `vad_executor` (one thread, in the order submitted), so a settings change lands between
two pushes and the reducer's FFTs stay off the event loop. What it hears goes back to the session through
callbacks: `on_speech_started()` (a barge-in, when barge-in is on), `on_utterance(audio,
item_id)` (an utterance ended: the next user turn) and `on_idle(audio, item_id)` (a silence
after an answer lasted the session's idle timeout, idle_timer.py, measured while `stretch()`
names a stretch of the session waiting for its user).

A clear of the buffer, or a switch of turn detection, forgets the utterance the VAD was hearing
(`_forget_utterance`), and with it what the VAD thread is hearing right then: the events of a
push that was in the VAD thread at that moment are dropped when it comes back, so no speech is
started or utterance committed by audio that was cleared. A client told of a speech_started
gets its speech_stopped first (OpenAI's clients expect one after each: the SDK's
InputAudioBufferSpeechStartedEvent), then input_audio_buffer.cleared says that its audio went.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from concurrent.futures import Executor

import numpy as np

from kimiaudio.audio.noise_reduction import NoiseReduction
from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.audio.vad import SpeechStarted, SpeechStopped, TurnDetector
from kimiaudio.server.session import server_events
from kimiaudio.server.session.event_fields import ProtocolError
from kimiaudio.server.session.event_sender import EventSender
from kimiaudio.server.session.idle_timer import IdleTimer
from kimiaudio.server.session.input_buffer import InputBuffer
from kimiaudio.server.session.queued_turn import new_item_id
from kimiaudio.server.session.session_settings import SessionSettings


class MicInput:
    def __init__(
        self,
        settings: SessionSettings,
        detector: TurnDetector,
        vad_executor: Executor,
        events: EventSender,
        on_speech_started: Callable[[], None],
        on_utterance: Callable[[np.ndarray, str], None],
        on_idle: Callable[[np.ndarray, str], None],
        stretch: Callable[[], Hashable],
    ):
        self._settings = settings
        self._detector = detector  # used only in the VAD thread
        self._vad_executor = vad_executor
        self._events = events
        self._on_speech_started = on_speech_started
        self._on_utterance = on_utterance
        self._on_idle = on_idle
        self._stretch = stretch
        self._idle = IdleTimer()
        self.buffer = InputBuffer()  # input_audio_buffer: appended audio, and what awaits a commit
        self._speech_item_id: str | None = None  # the item an utterance in progress will become
        self._vad_heard = 0  # samples the VAD heard: the clock of its events (a speech_stopped at a clear)
        self._forgets = 0  # clears and switches so far: a push sent to the VAD before one is out of date
        self._mode = settings.turn_detection  # "none": the client commits; else the VAD does
        self._reducer: NoiseReduction | None = None  # the session's noise_reduction (in the VAD thread)
        self._reduces = False  # (on the loop) whether a noise_reduction was ever asked for

    async def push(self, pcm: np.ndarray, event_id: str | None = None) -> None:
        """16 kHz mono float32 (`event_id`: the input_audio_buffer.append's, for an error about
        it). Waits for the VAD only, never for a turn."""
        loop = asyncio.get_running_loop()
        kind = self._settings.noise_reduction
        self._reduces = self._reduces or kind is not None
        if self._settings.turn_detection == "none":
            if self._reduces:
                pcm = await loop.run_in_executor(self._vad_executor, self._reduced, pcm, kind)
            self._idle.heard(pcm, None, None, 0)  # (the clock counts all the audio written)
            self._keep(pcm, event_id)
            return
        forgets = self._forgets
        pcm, events = await loop.run_in_executor(self._vad_executor, self._hear, pcm, kind)
        self._after_vad(pcm, events if forgets == self._forgets else [])

    def _hear(self, pcm: np.ndarray, kind: str | None) -> tuple[np.ndarray, list]:
        """(In the VAD thread) the input reduced as `kind` asks, and what the VAD heard in it."""
        pcm = self._reduced(pcm, kind)
        return pcm, self._detector.push(pcm)

    def _after_vad(self, pcm: np.ndarray, events: list) -> None:
        """The VAD heard `pcm`: its events go out, an utterance it ends becomes a turn."""
        self._vad_heard += pcm.size
        for event in events:
            match event:
                case SpeechStarted(audio_start_ms=start_ms):
                    self._speech_item_id = new_item_id()
                    self._events.send(server_events.speech_started(start_ms, self._speech_item_id))
                    self._on_speech_started()
                case SpeechStopped(audio=audio, audio_end_ms=end_ms):
                    item_id, self._speech_item_id = self._speech_item_id or new_item_id(), None
                    self._events.send(server_events.speech_stopped(end_ms, item_id))
                    self._on_utterance(audio, item_id)
        stretch = self._stretch() if self._speech_item_id is None else None
        max_samples = int(self._settings.config.audio.max_input_seconds * SPEECH_INPUT_RATE)
        onset = self._detector.state == "pending"  # (read between two of its pushes: this session's)
        timeout = self._idle.heard(pcm, stretch, self._settings.idle_timeout_ms, max_samples, hold=onset)
        if timeout is not None:
            item_id = new_item_id()
            self._events.send(server_events.idle_timeout(timeout.audio_start_ms, timeout.audio_end_ms, item_id))
            self._on_idle(timeout.audio, item_id)

    def _keep(self, pcm: np.ndarray, event_id: str | None) -> None:
        seconds = self._settings.config.audio.max_input_seconds
        if not self.buffer.keep(pcm, int(seconds * SPEECH_INPUT_RATE)):
            self._events.error(
                "input_audio_buffer_full",
                f"the input audio buffer holds at most {seconds:g} s (audio.max_input_seconds); commit or clear it",
                event_id=event_id,
            )

    async def take_commit(self) -> tuple[np.ndarray, str | None]:
        """input_audio_buffer.commit -> (the audio committed, its item id if already named).
        With turn detection off: the buffered audio. With the server's VAD: the utterance it is
        hearing, ended now (speech_stopped, if its speech_started was sent), as OpenAI lets a
        client commit in VAD mode; no utterance, nothing to commit."""
        if self._settings.turn_detection == "none":
            return await self._take_buffer(), None
        held, events, stopped = await asyncio.get_running_loop().run_in_executor(self._vad_executor, self._end_now)
        if held.size:
            self._after_vad(held, events)
        if stopped is None:
            raise ProtocolError(
                "input_audio_buffer_commit_empty",
                "input_audio_buffer.commit: no speech heard since the last turn (the server's VAD commits each "
                "utterance itself)",
            )
        item_id, self._speech_item_id = self._speech_item_id, None
        if item_id is not None:
            self._events.send(server_events.speech_stopped(stopped.audio_end_ms, item_id))
        return stopped.audio, item_id

    def _end_now(self) -> tuple[np.ndarray, list, SpeechStopped | None]:
        """(In the VAD thread) a commit: what the reducer still held, and what the VAD heard in
        it; then the utterance it is hearing, ended."""
        held = self._flush_reducer()
        events = self._detector.push(held) if held.size else []
        return held, events, self._detector.end_now()

    async def _take_buffer(self) -> np.ndarray:
        """The buffered audio (turn detection off)."""
        held = np.zeros(0, np.float32)
        if self._reduces:
            held = await asyncio.get_running_loop().run_in_executor(self._vad_executor, self._flush_reducer)
        if held.size:  # what the reducer still held of the audio appended is part of the turn
            self._keep(held, None)
        audio = self.buffer.take()
        if audio is None:
            raise ProtocolError("input_audio_buffer_commit_empty", "input_audio_buffer.commit: the buffer is empty")
        return audio

    def clear(self) -> None:
        """input_audio_buffer.clear: the buffer, and an utterance in progress, forgotten."""
        self.buffer.clear()
        self._reset_reducer()
        self._idle.restart()
        self._forget_utterance()
        self._events.send(server_events.buffer_cleared())

    def configure(self) -> None:
        """The session's settings changed: the VAD takes them between two pushes. A switch
        between the VAD and the client's commits starts from an empty buffer: audio kept for a
        commit, or an utterance the VAD was hearing, belongs to the way it was taken
        (input_audio_buffer.cleared says so, when there was any)."""
        mode, self._mode = self._mode, self._settings.turn_detection
        if (mode == "none") != (self._mode == "none"):
            self._idle.restart()
            kept = self.buffer.take() is not None  # (emptied either way)
            self._reset_reducer()
            if self._forget_utterance() or kept:
                self._events.send(server_events.buffer_cleared())
        self._vad_executor.submit(self._detector.configure, self._settings.turn_settings())

    def _forget_utterance(self) -> bool:
        """The utterance the VAD is hearing, and what it hears now, forgotten -> whether its
        speech had started (its speech_stopped is sent here)."""
        self._forgets += 1
        self._vad_executor.submit(self._detector.reset)
        item_id, self._speech_item_id = self._speech_item_id, None
        if item_id is not None:
            end_ms = self._vad_heard * 1000 // SPEECH_INPUT_RATE
            self._events.send(server_events.speech_stopped(end_ms, item_id))
        return item_id is not None

    def _reduced(self, pcm: np.ndarray, kind: str | None) -> np.ndarray:
        """(In the VAD thread) the input with its noise turned down as `kind` asks (a change of
        kind takes effect here: what the old reducer held comes out first, so no audio is lost)."""
        held = np.zeros(0, np.float32)
        if self._reducer is not None and self._reducer.kind != kind:
            held, self._reducer = self._reducer.flush(), None
        if kind is not None and self._reducer is None:
            self._reducer = NoiseReduction(kind)
        out = self._reducer.push(pcm) if self._reducer is not None else pcm
        return np.concatenate([held, out]) if held.size else out

    def _flush_reducer(self) -> np.ndarray:
        """(In the VAD thread) the audio the reducer still holds."""
        return self._reducer.flush() if self._reducer is not None else np.zeros(0, np.float32)

    def _reset_reducer(self) -> None:
        """The audio the reducer holds was cleared with the rest (its noise estimate is kept)."""
        if self._reduces:
            self._vad_executor.submit(self._reset_reducer_now)

    def _reset_reducer_now(self) -> None:
        if self._reducer is not None:
            self._reducer.reset()
