"""The detokenizer worker: speech codes in, 24 kHz PCM chunks out, each turn ended here.

One thread (and on CUDA one stream) owns the detokenizer and every turn's DetokStream.
The LM worker posts, in order per turn: `open` (a new speaking turn), `push_codes` (the codes
of one LM step, all turns at once), `end` (the LM is done: its TurnDone so far). Each
iteration runs one chunk of each of the most urgent streams as one batch, at most
detok.max_batch_sessions of them (detok/realtime_guard.py): a turn's first chunk before any
later chunk or flush of the turns already playing, and while a first chunk is due only the
playing turns that would run dry before the next batch lands join it, so first audio is not
held back by a batch sized for everyone; otherwise the streams whose playback runs dry soonest
(while the LM has work, a stream with more than detok.run_ahead_s of audio left waits, so the
GPU time goes to the tokens everyone needs). When a playing stream would run dry before its
next chunk lands, the real-time guard runs the batch's later chunks with fewer ODE steps (down
to detok.min_ode_steps). A stream with more chunks due (a flush) gets the next one in a later
batch. On CUDA the detokenizer's graphs were captured
before the worker started (pipeline.py); they replay on this worker's stream. An LM step never waits for
a batch here, and a batch waits for no LM step: the two threads run side by side.

Voice prompts' DiT prefixes live here too (pipeline/voice_bank.py): computed once per voice,
shared by every stream speaking in it, dropped least recently used beyond voices.cache_mib.

A failing batch fails its turns alone (their tokens are spent: their audio cannot be made
whole) and tells the LM worker to stop generating for them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future

import torch

from kimiaudio.detok.detokenizer import DetokItem
from kimiaudio.detok.realtime_guard import plan_chunks
from kimiaudio.pipeline.detok_turn import DetokTurn
from kimiaudio.pipeline.events import TurnDone
from kimiaudio.pipeline.metrics import PipelineMetrics
from kimiaudio.pipeline.turn_handle import TurnHandle, deliver_done, failure_message
from kimiaudio.pipeline.voice_bank import VoiceBank
from kimiaudio.pipeline.voice_registry import Voice
from kimiaudio.pipeline.worker import Worker
from kimiaudio.pipeline.worker_messages import CancelTurn, EndTurn, OpenStream, PushCodes

log = logging.getLogger(__name__)


class DetokWorker(Worker):
    def __init__(
        self,
        detokenizer,
        config,
        device,
        metrics: PipelineMetrics,
        llm_busy: Callable[[], bool],
        on_failed: Callable[[str], None],
    ):
        super().__init__("kimiaudio-detok", device, config.engine.cpu_threads)
        self.detokenizer, self.cfg, self.metrics = detokenizer, config.detok, metrics
        self._llm_busy = llm_busy
        self._on_failed = on_failed  # turn id -> stop its generation (the LM worker's drop)
        self.num_turns = 0  # for stats
        self.voices = VoiceBank(self._build_prefix, config.voices.cache_mib * 2**20)
        self._max_prompt_chunks = config.voices.max_prompt_chunks
        self._turns: dict[str, DetokTurn] = {}
        # The detokenizer's step counts; how many to batch and how far ahead to run are this
        # pipeline's serving policy (its config), which may differ from the one it was loaded with.
        self._guard_settings = dataclasses.replace(
            detokenizer.guard_settings, max_batch_sessions=self.cfg.max_batch_sessions, run_ahead_s=self.cfg.run_ahead_s
        )

    # ---- any thread (the LM worker) --------------------------------------------------------
    def open(
        self, handle: TurnHandle, seed: int | None, voice: Voice | None = None, playback_speed: float = 1.0
    ) -> None:
        self.post(OpenStream(handle, seed, voice, playback_speed))

    def push_codes(self, codes: list[tuple[str, int]]) -> None:
        self.post(PushCodes(codes))

    def end(self, turn_id: str, result: TurnDone) -> None:
        self.post(EndTurn(turn_id, result))

    def cancel(self, turn_id: str) -> None:
        self.post(CancelTurn(turn_id))

    def prepare_voice(self, voice) -> Future:
        """Compute (or find) the voice's prefix now; the future fails if the voice cannot be used."""

        def build() -> None:
            self.voices.prefix(voice)

        return self.call(build)

    def forget_voice(self, key: str) -> Future:
        return self.call(lambda: self.voices.forget(key))

    # ---- worker thread -----------------------------------------------------------------------
    def handle(self, message: object) -> None:
        match message:
            case OpenStream(handle=handle, seed=seed, voice=voice, playback_speed=speed):
                prefix = None if voice is None else self.voices.prefix(voice)
                stream = self.detokenizer.new_stream(seed=seed, voice=prefix)
                self._turns[handle.turn_id] = DetokTurn(handle, stream, speed)
            case PushCodes(codes=step_codes):
                by_turn: dict[str, list[int]] = {}
                for turn_id, code in step_codes:
                    by_turn.setdefault(turn_id, []).append(code)
                for turn_id, codes in by_turn.items():
                    turn = self._turns.get(turn_id)
                    if turn is None:
                        continue  # cancelled or failed meanwhile
                    try:
                        turn.push(codes)
                    except Exception as exc:
                        self._fail([turn], failure_message("detokenizer", exc))
            case EndTurn(turn_id=turn_id, result=result):
                turn = self._turns.get(turn_id)
                if turn is not None:
                    turn.result = result
                    if result.status != "completed":  # cancelled or failed: no more audio is wanted
                        self._close(turn, result.status)
            case CancelTurn(turn_id=turn_id):
                turn = self._turns.get(turn_id)
                if turn is not None:
                    self._close(turn, "cancelled")
        self.num_turns = len(self._turns)

    def iterate(self) -> float | None:
        due = [t for t in self._turns.values() if t.has_chunk_due]
        now = time.perf_counter()
        busy = self._llm_busy()
        plan = plan_chunks(due, now, busy, self._guard_settings, self.detokenizer.cost)
        batch = plan.streams
        if batch:
            self.metrics.detok_guard_actions += plan.num_lowered
            self._run(batch, plan.ode_steps)
        for turn in [t for t in self._turns.values() if not t.has_chunk_due]:
            if turn.result is not None:  # final, and every chunk flushed
                self._close(turn, turn.result.status)
        self.num_turns = len(self._turns)
        if any(t.has_chunk_due for t in self._turns.values()):
            if batch:
                return 0
            # Held back while the LM is busy: wake when the first of them gets close to running dry.
            soonest = min(t.playback_deadline for t in self._turns.values() if t.has_chunk_due)
            return max(soonest - self.cfg.run_ahead_s - time.perf_counter(), 0.0005)
        return None

    def on_stop(self) -> None:
        for turn in list(self._turns.values()):
            self._close(turn, "failed", "server shutting down")

    def on_error(self, message: object | None, exc: Exception) -> None:
        error = failure_message("detokenizer", exc)
        match message:
            case OpenStream(handle=handle):  # the stream could not be made: the turn ends before its audio
                deliver_done(handle, TurnDone("failed", error=error), self.metrics)
                self._on_failed(handle.turn_id)
            case EndTurn(turn_id=turn_id) | CancelTurn(turn_id=turn_id) if turn_id in self._turns:
                self._fail([self._turns[turn_id]], error)
            case _:  # a bug past any one turn: fail them all, keep serving
                self._fail(list(self._turns.values()), error)

    def on_died(self, error: str) -> None:
        self._fail(list(self._turns.values()), error)

    def on_refused(self, message: object, reason: str) -> None:
        if isinstance(message, OpenStream):  # the turn would wait for audio no thread makes
            deliver_done(message.handle, TurnDone("failed", error=reason), self.metrics)
            self._on_failed(message.handle.turn_id)

    def _build_prefix(self, voice):
        return self.detokenizer.voice_prefix(torch.from_numpy(voice.wav24k), voice.codes, self._max_prompt_chunks)

    # ---- chunks --------------------------------------------------------------------------
    def _run(self, batch: list[DetokTurn], ode_steps: list[int | None]) -> None:
        start = time.perf_counter()
        self.metrics.detok_batches_started += 1  # the LM worker's step records read these
        try:
            wavs = self.detokenizer.step_batch(
                [DetokItem(t.stream, [], t.final, steps) for t, steps in zip(batch, ode_steps)], rounds=1
            )
        except Exception as exc:  # e.g. out of GPU memory: these turns fail, the server goes on
            log.exception("detokenizer batch of %d failed", len(batch))
            self._fail(batch, failure_message("detokenizer", exc))
            return
        finally:
            self.metrics.detok_batches_ended += 1
        self.metrics.detok_batch_s.observe(time.perf_counter() - start)
        self.metrics.note_detok_memory(sum(t.stream.held_bytes() for t in self._turns.values()), self.voices.nbytes)
        ran = sum(1 for w in wavs if w.numel())
        self.metrics.detok_chunks += ran
        self.metrics.note_batch("detok", ran)
        for turn, wav in zip(batch, wavs):
            chunk = turn.chunk(wav)
            if chunk is not None:
                turn.handle.deliver(chunk)

    def _fail(self, turns: list[DetokTurn], error: str) -> None:
        for turn in turns:
            if turn.turn_id in self._turns:
                self._close(turn, "failed", error)
                self._on_failed(turn.turn_id)

    def _close(self, turn: DetokTurn, status: str, error: str | None = None) -> None:
        """End the turn here: its stream is dropped, its TurnDone delivered."""
        self._turns.pop(turn.turn_id, None)
        result = turn.result or TurnDone(status)
        timings = dict(result.timings)
        if turn.first_pcm_s is not None:
            timings["first_pcm_s"] = turn.first_pcm_s
        done = dataclasses.replace(result, status=status, timings=timings, error=error or result.error)
        deliver_done(turn.handle, done, self.metrics)
