"""The LM worker: committed turns in; text deltas out, speech codes on to the detokenizer.

One thread (and on CUDA one stream) owns the speech encoders, prompt building and the engine.
Each iteration it
1. encodes new user audio (Whisper features + GLM-4 VQ codes) in batches of at most
   `audio.encode_batch_size` utterances (pipeline/speech_encoding.py): while answers are being
   generated a few encoder stages per iteration (about one engine step's time), all at once
   when idle; on CUDA the encoders run on a stream of their own beside the decode steps, and a
   batch's results come back to the host behind an event this thread polls, never waits on.
   Each batch's turns get its results as soon as it ends, not when the whole burst is encoded;
2. admits turns whose audio is all encoded: prompt (history KV is shared through the engine's
   prefix cache), engine request, detokenizer stream;
3. runs one engine step over every running sequence and routes its outputs
   (pipeline/output_routing.py): text deltas to the turn's handle, speech codes to the
   detokenizer worker (one message per step), the end of a turn to the detokenizer worker
   (which flushes its audio and ends it) or, for a turn without speech, straight to the
   handle. Each step is recorded with what it carried (pipeline/step_record.py: a prefill
   chunk, encoder stages before it, a detokenizer batch or graph capture beside it, a garbage
   collection, a new shape), so a bench can say why a step was slow.
Any failure handling one turn fails that turn alone: its KV blocks are freed, its TurnDone
says why. The event loop only posts here (submit, cancel); it never waits on this thread.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future

from kimiaudio.audio.io import check_speech_input
from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.engine.llm_engine import LLMEngine
from kimiaudio.engine.request import EngineRequest, RequestPrompt
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.encode_cache import audio_key
from kimiaudio.pipeline.events import TurnDone, UserEncoded
from kimiaudio.pipeline.lm_turn import LmTurn
from kimiaudio.pipeline.metrics import PipelineMetrics
from kimiaudio.pipeline.output_routing import route_outputs
from kimiaudio.pipeline.speech_encoding import SpeechEncoding
from kimiaudio.pipeline.step_record import StepRecorder
from kimiaudio.pipeline.turn_handle import TurnHandle, client_fault, deliver_done, failure_message
from kimiaudio.pipeline.turn_prompt import turn_prompt
from kimiaudio.pipeline.turn_request import TurnRequest
from kimiaudio.pipeline.worker import URGENT, Worker
from kimiaudio.pipeline.worker_messages import CancelTurn, DropTurn, SubmitTurn
from kimiaudio.text.output_type import BOTH, TEXT, check_output_type
from kimiaudio.text.prompt import build_prompt

log = logging.getLogger(__name__)

# While the only work left is an encoder batch running on the device: how often to look
# whether its results are back (a message, such as a new turn, wakes the worker sooner).
ENCODE_POLL_S = 0.0005


class LmWorker(Worker):
    # Times engine steps, and so the encoding slices' budget (a test may swap in a fake clock).
    clock = staticmethod(time.perf_counter)
    cpu_clock = staticmethod(time.thread_time)  # this thread's CPU time

    def __init__(self, stack, config, engine: LLMEngine, detok, metrics: PipelineMetrics):
        # The urgent stream: every session's next token waits on a decode step, while a
        # detokenizer chunk has its playback run-ahead to spare.
        super().__init__("kimiaudio-lm", stack.device, config.engine.cpu_threads, stream_priority=URGENT)
        self.stack, self.config, self.engine, self.metrics = stack, config, engine, metrics
        self.detok = detok  # DetokWorker, or None when the stack has no detokenizer
        self.busy = False  # read by the detokenizer worker: the engine has work
        self.num_turns = 0  # turns on this worker (pending or generating), for stats
        self._pending: list[LmTurn] = []  # waiting for their audio to be encoded
        self._turns: dict[str, LmTurn] = {}  # generating: request id (= turn id) -> turn
        self._encoding = SpeechEncoding(stack, config.audio.encode_batch_size, metrics, self.clock)
        self._step_s = 0.0  # the last engine step's time: one encoding slice's budget while busy
        self._steps = StepRecorder()  # what each step carried (pipeline/step_record.py)

    # ---- any thread ------------------------------------------------------------------------
    def submit(self, handle: TurnHandle, request: TurnRequest) -> None:
        self.post(SubmitTurn(handle, request))

    def cancel(self, turn_id: str) -> None:
        """End the turn now, status cancelled, wherever it is (also past the LM)."""
        self.post(CancelTurn(turn_id))

    def voice_codes(self, pcm16k) -> Future:
        """The GLM-4 tokenizer's codes of a voice reference (16 kHz), computed on this thread."""
        return self.call(lambda: [int(c) for c in self.stack.glm4.tokenize_batch([pcm16k])[0]])

    def drop(self, turn_id: str) -> None:
        """Stop generating for a turn that already ended downstream (its detokenizer failed)."""
        self.post(DropTurn(turn_id))

    # ---- worker thread -----------------------------------------------------------------------
    def handle(self, message: object) -> None:
        match message:
            case SubmitTurn(handle=handle, request=request):
                self._take(handle, request)
            case CancelTurn(turn_id=turn_id):
                self._cancel(turn_id)
            case DropTurn(turn_id=turn_id):
                turn = self._turns.pop(turn_id, None)
                if turn is not None and turn.seq_id is not None:
                    self.engine.abort(turn.seq_id)
        self._count()

    def _take(self, handle: TurnHandle, request: TurnRequest) -> None:
        """A submitted turn waits for its audio to be encoded (a written turn: its history's)."""
        spoken = request.user_audio
        try:
            if spoken is not None:
                # Silence is refused where input comes in (unless it is meant: an idle timeout's).
                check_speech_input(spoken, self.config.audio, silence_ok=True)
        except KimiAudioError as exc:
            deliver_done(handle, TurnDone("failed", error=str(exc)), self.metrics)
            return
        audio = {audio_key(t.audio): t.audio for t in request.history if t.role == "user" and t.audio is not None}
        if spoken is not None:
            audio[audio_key(spoken)] = spoken
        pending = LmTurn(handle, request, audio, handle.seconds())
        pending.submit_step = self.engine.stats().num_steps
        self._pending.append(pending)

    def iterate(self) -> float | None:
        encode_stages = 0
        if self._pending or self._encoding.has_job:
            self._encode_some()
            encode_stages = self._encoding.num_stages
            self._admit_ready()
        if self.engine.has_work():
            self._step(encode_stages)
        was_busy, self.busy = self.busy, self.engine.has_work()
        if was_busy and not self.busy and self.detok is not None:
            self.detok.wake()  # chunks held back while the LM was busy may run now
        self._count()
        if self.busy:
            return 0
        if self._encoding.has_job and encode_stages == 0:
            return ENCODE_POLL_S  # only results on the device to wait for: no busy loop
        return 0 if (self._pending or self._encoding.has_job) else None

    def on_stop(self) -> None:
        self._fail_all("server shutting down")

    def on_died(self, error: str) -> None:
        self.busy = False
        self._fail_all(error)

    def on_refused(self, message: object, reason: str) -> None:
        if isinstance(message, SubmitTurn):
            deliver_done(message.handle, TurnDone("failed", error=reason), self.metrics)

    def on_error(self, message: object | None, exc: Exception) -> None:
        if isinstance(message, SubmitTurn):
            deliver_done(
                message.handle,
                TurnDone("failed", error=failure_message("starting the turn", exc), error_code=client_fault(exc)),
                self.metrics,
            )
            return
        # A bug past any one turn (e.g. in the engine's bookkeeping): fail every turn, keep serving.
        self._fail_all(failure_message("generation", exc))

    def _fail_all(self, error: str) -> None:
        """Every turn on this worker ends, failed with `error`."""
        for pending in self._pending:
            if pending.handle.turn_id not in self._turns:  # (one admitted as the worker broke: ended below)
                deliver_done(pending.handle, TurnDone("failed", error=error), self.metrics)
        self._pending.clear()
        for turn in list(self._turns.values()):
            self._finish(turn, "failed", error)

    # ---- stages --------------------------------------------------------------------------
    def _encode_some(self) -> None:
        """About one engine step's worth of encoder stages while answers are being generated;
        the whole batch when nothing is (pipeline/speech_encoding.py)."""
        budget = self._step_s if self.engine.has_work() else math.inf
        for key, exc in self._encoding.advance(self._pending, budget):
            self._fail_pending(key, failure_message("speech encoding", exc))

    def _fail_pending(self, key: bytes, error: str) -> None:
        for pending in [p for p in self._pending if key in p.audio]:
            self._pending.remove(pending)
            deliver_done(pending.handle, TurnDone("failed", error=error), self.metrics)

    def _admit_ready(self) -> None:
        for pending in [p for p in self._pending if not p.missing]:
            try:
                self._admit(pending)
            except Exception as exc:
                if not isinstance(exc, KimiAudioError):
                    log.exception("starting turn %s failed", pending.handle.turn_id)
                turn = self._turns.get(pending.handle.turn_id)
                if turn is not None:
                    self._finish(
                        turn, "failed", failure_message("starting the turn", exc), error_code=client_fault(exc)
                    )
                else:
                    deliver_done(
                        pending.handle,
                        TurnDone(
                            "failed", error=failure_message("starting the turn", exc), error_code=client_fault(exc)
                        ),
                        self.metrics,
                    )
            # Pending until here: a BaseException in _admit (the worker's end) leaves it to
            # _fail_all, which fails every turn held, admitted or not.
            self._pending.remove(pending)

    def _admit(self, turn: LmTurn) -> None:
        handle, request = turn.handle, turn.request
        speaks = check_output_type(request.output_type) == BOTH and self.detok is not None
        output_type = BOTH if speaks else TEXT
        tokenizer, specials = self.stack.tokenizer, self.stack.specials
        prompt, params, left_out = turn_prompt(
            turn.messages(),
            lambda messages: build_prompt(messages, output_type, tokenizer, specials),
            output_type,
            request.sampling or SamplingParams.from_config(self.config.sampling),
            self.engine.max_sequence_len,
            request.truncation,
        )
        if left_out:
            log.info("turn %s: the %d oldest history messages left out (truncation)", handle.turn_id, left_out)
        spoken = request.user_audio  # None: a written turn, no audio of its own to report
        encoded = None
        if spoken is not None:
            encoded = UserEncoded(list(turn.encoded[audio_key(spoken)][0]), len(spoken) / SPEECH_INPUT_RATE)
        turn.start(specials.token_offset, specials.text_eos, speaks, specials.text_blank)
        turn.count_prompt(prompt.audio_ids, prompt.text_ids)
        turn.timings["queued_s"] = turn.queued_s
        turn.mark("encoded_s")
        turn.seq_id = self.engine.add_request(
            EngineRequest(
                handle.turn_id,
                RequestPrompt(prompt.audio_ids, prompt.text_ids, prompt.continuous_mask, prompt.features_tensor()),
                params,
                output_type,
                specials,
                request.priority,
            )
        )
        if encoded is not None:  # after the engine took the prompt: the turn's first event says it did
            handle.deliver(encoded)
        self._turns[handle.turn_id] = turn
        if speaks:
            self.detok.open(handle, params.seed, request.voice, request.playback_speed)

    def _step(self, encode_stages: int) -> None:
        m = self.metrics
        self._steps.begin(self.engine.stats(), m.beside(), encode_stages, self._encoding.on_device)
        start, cpu_start = self.clock(), self.cpu_clock()
        outputs = self.engine.step()
        cpu_s = self.cpu_clock() - cpu_start  # read inside the wall-clock span: at most its length
        self._step_s = self.clock() - start
        stats = self.engine.stats()
        record = self._steps.end(self._step_s, stats, m.beside(), cpu_s)
        if outputs:
            m.lm_step_s.observe(self._step_s)
            m.lm_batch.observe(len(outputs))
            m.note_batch("llm", len(outputs))
            m.note_step(record)
        m.note_free_blocks(stats.num_blocks_free)
        routed = route_outputs(outputs, self._turns, self.stack.tokenizer)
        if routed.codes:
            self.detok.push_codes(routed.codes)  # before any end below: a turn's codes precede its end
        for turn, status, error, reason in routed.ended:
            self._finish(turn, status, error, reason)

    def _finish(
        self, turn: LmTurn, status: str, error: str | None, reason: str | None = None, error_code: str | None = None
    ) -> None:
        """The LM is done with the turn: free its KV, hand its end on."""
        self._turns.pop(turn.turn_id, None)
        if turn.seq_id is not None:
            seq_id, turn.seq_id = turn.seq_id, None
            try:
                self.engine.abort(seq_id)
            except Exception:  # the engine's own state is what broke: the turn ends all the same
                log.exception("freeing the KV blocks of turn %s failed", turn.turn_id)
        result = turn.result(status, error, reason, error_code)
        if turn.speaks:
            self.detok.end(turn.turn_id, result)
        else:
            deliver_done(turn.handle, result, self.metrics)

    def _cancel(self, turn_id: str) -> None:
        for pending in self._pending:
            if pending.handle.turn_id == turn_id:
                self._pending.remove(pending)
                deliver_done(pending.handle, TurnDone("cancelled"), self.metrics)
                return
        turn = self._turns.get(turn_id)
        if turn is not None:
            self._finish(turn, "cancelled", None, "abort")
        elif self.detok is not None:
            self.detok.cancel(turn_id)  # past the LM: only its audio is still being made

    def _count(self) -> None:
        self.num_turns = len(self._pending) + len(self._turns)
