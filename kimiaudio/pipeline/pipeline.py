"""The GPU worker: a user turn (audio + history) goes in; text deltas and 24 kHz PCM come out.

One worker thread (the AsyncEngine's) owns every model. Each iteration it
1. takes newly submitted turns and cancellations; encodes all new user audio of those turns
   in one batch (Whisper features + GLM-4 VQ codes), builds each prompt and adds it to the
   engine (history KV is shared through the engine's prefix cache);
2. runs one engine step over every running sequence (continuous batching);
3. routes the step's tokens to their turns and runs the detokenizer chunks now due, batched
   across sessions, then publishes events to each turn's handle on the asyncio loop. Priority
   is latency: the sessions whose playback runs dry soonest go first, at most
   detok.max_batch_sessions per iteration, and while the LLM has work a session with more
   than detok.run_ahead_s of audio left waits (its chunk would only delay everyone's tokens).
The asyncio side only enqueues (submit, cancel) and reads handles; it never waits on the worker.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import queue
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from kimiaudio.engine.async_engine import AsyncEngine
from kimiaudio.engine.llm_engine import LLMEngine
from kimiaudio.engine.request import EngineRequest
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.events import PCM_SAMPLE_RATE, TurnDone, UserEncoded
from kimiaudio.detok.scheduling import chunks_to_run
from kimiaudio.pipeline.turn import TurnHandle, TurnState
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.text.prompt import Message, build_prompt

log = logging.getLogger(__name__)

ENCODE_CACHE_SIZE = 512  # utterances whose (codes, features) stay cached for history reuse


@dataclass
class HistoryTurn:
    role: str  # "user" | "assistant"
    text: str = ""
    audio: np.ndarray | None = None  # user turns: float32 mono 16 kHz (re-encoded when not cached)
    audio_tokens: list[int] | None = None  # assistant turns: generated VQ codes (no offset)


@dataclass
class TurnRequest:
    conversation_id: str
    history: list[HistoryTurn]
    user_audio: np.ndarray  # float32 mono 16 kHz
    sampling: SamplingParams | None = None
    output_type: str = "both"


class Pipeline:
    def __init__(self, stack, config):
        if stack.detokenizer is not None and stack.detokenizer.sample_rate != PCM_SAMPLE_RATE:
            raise KimiAudioError(f"vocoder/config.json: sampling_rate {stack.detokenizer.sample_rate}; the pipeline "
                                 f"streams {PCM_SAMPLE_RATE} Hz, the official vocoder's rate")
        self.stack = stack
        self.config = config
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._turns: dict[str, TurnState] = {}  # worker thread only
        self._encoded: OrderedDict[bytes, tuple[list[int], object]] = OrderedDict()  # worker only
        self._ids = itertools.count()
        self.engine = LLMEngine(stack.lm, config.engine, stack.device, stack.dtype)
        self._worker: AsyncEngine | None = None
        self.last_batch: dict[str, int] = {"encode": 0, "llm": 0, "detok": 0}
        # Bench instrumentation: per-iteration time (engine step + detokenizer) and pool low-water mark.
        self.record_step_times = False
        self.step_times: list[float] = []
        self.min_free_blocks = self.engine.stats().num_blocks_free
        self._iteration_start = 0.0
        self.max_batch: dict[str, int] = {"encode": 0, "llm": 0, "detok": 0}

    async def start(self) -> None:
        self._worker = AsyncEngine(self.engine, before_step=self._before_step, after_step=self._after_step,
                                   name="kimiaudio-gpu", on_start=self._configure_thread)

    async def stop(self) -> None:
        if self._worker is not None:
            worker, self._worker = self._worker, None
            await asyncio.get_running_loop().run_in_executor(None, worker.stop, 30.0)
            for state in list(self._turns.values()):
                self._end(state, "failed", "server shutting down")

    def submit(self, request: TurnRequest) -> TurnHandle:
        """Queue a turn (from the event loop); iterate the handle for its events."""
        if self._worker is None:
            raise KimiAudioError("pipeline is not running")
        handle = TurnHandle(f"turn-{next(self._ids)}", asyncio.get_running_loop())
        self._inbox.put(("submit", handle, request))
        self._worker.wake()
        return handle

    def cancel(self, handle: TurnHandle) -> None:
        """Stop a turn now: its KV blocks and detokenizer state are dropped on the worker."""
        if self._worker is not None and handle.done is None:
            self._inbox.put(("cancel", handle, None))
            self._worker.wake()

    def stats(self) -> dict:
        s = self.engine.stats()
        return {
            "kv_blocks_total": s.num_blocks_total, "kv_blocks_free": s.num_blocks_free,
            "running": s.num_running, "waiting": s.num_waiting, "turns": len(self._turns),
            "prefill_tokens_computed": s.num_prefill_tokens_computed,
            "prefill_tokens_cached": s.num_prefill_tokens_cached,
            "decode_tokens": s.num_decode_tokens, "preemptions": s.num_preemptions, "steps": s.num_steps,
            "last_batch_sizes": dict(self.last_batch), "max_batch_sizes": dict(self.max_batch),
        }

    # ---- worker thread -------------------------------------------------------------------
    def _configure_thread(self) -> None:
        configure_worker_thread(self.stack.device, self.config.engine.cpu_threads)

    def _before_step(self) -> bool:
        self._iteration_start = time.perf_counter()
        submits = []
        while True:
            try:
                kind, handle, request = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "cancel":
                state = self._turns.get(handle.turn_id)
                if state is not None:
                    self._end(state, "cancelled", None)
                else:  # not started yet: drop it from this batch
                    submits = [(h, r) for h, r in submits if h is not handle]
                    handle.deliver(TurnDone("cancelled"))
            else:
                submits.append((handle, request))
        if submits:
            self._start_turns(submits)
        return bool(self._turns)

    def _start_turns(self, submits: list[tuple[TurnHandle, TurnRequest]]) -> None:
        # Every utterance not in the cache, of every new turn, goes through the encoders at once.
        wanted = [turn.audio for _, request in submits for turn in request.history
                  if turn.role == "user" and turn.audio is not None] + [r.user_audio for _, r in submits]
        missing = {key: pcm for pcm in wanted if (key := _audio_key(pcm)) not in self._encoded}
        if missing:
            try:
                encoded = self.stack.encode_speech_batch(list(missing.values()))
            except Exception as exc:  # a broken input fails the turns of this batch, not the server
                log.exception("speech encoding failed")
                for handle, _ in submits:
                    handle.deliver(TurnDone("failed", error=f"speech encoding failed: {exc}"))
                return
            for key, (codes, features) in zip(missing, encoded):
                # Kept on the host: 512 utterances' [T, 5120] features would otherwise grow on
                # the GPU outside the KV pool's budget (up to ~8 GB in bf16 at the input limit);
                # the engine copies a prompt's features to the device once, at submit.
                self._remember(key, (codes, features.cpu()))
        self._note_batch("encode", len(missing))
        for handle, request in submits:
            try:
                self._add_turn(handle, request)
            except KimiAudioError as exc:
                handle.deliver(TurnDone("failed", error=str(exc)))

    def _add_turn(self, handle: TurnHandle, request: TurnRequest) -> None:
        messages = [self._history_message(turn) for turn in request.history]
        codes, features = self._encoded[_audio_key(request.user_audio)]
        messages.append(Message("user", "audio", audio_tokens=codes, features=features))
        handle.deliver(UserEncoded(list(codes), len(request.user_audio) / 16000))
        prompt = build_prompt([m for m in messages if m is not None], request.output_type,
                              self.stack.tokenizer, self.stack.specials)
        params = request.sampling or SamplingParams.from_config(self.config.sampling)
        state = TurnState(handle, handle.turn_id, self.stack.specials.token_offset, self.stack.specials.text_eos,
                          prompt_len=len(prompt))
        state.mark("encoded_s")
        if request.output_type == "both" and self.stack.detokenizer is not None:
            state.detok = self.stack.detokenizer.new_session(seed=params.seed)
        state.seq_id = self.engine.add_request(EngineRequest(
            handle.turn_id, prompt.audio_ids, prompt.text_ids, prompt.continuous_mask, prompt.features_tensor(),
            params, request.output_type, self.stack.specials))
        self._turns[handle.turn_id] = state

    def _history_message(self, turn: HistoryTurn) -> Message | None:
        if turn.role == "user":
            if turn.audio is not None:
                codes, features = self._encoded[_audio_key(turn.audio)]
                return Message("user", "audio", audio_tokens=codes, features=features)
            return Message("user", "text", text=turn.text) if turn.text else None
        return Message.assistant_reply(turn.text, turn.audio_tokens) if turn.text or turn.audio_tokens else None

    def _after_step(self, outputs) -> bool:
        self._note_batch("llm", len(outputs))
        for output in outputs:
            state = self._turns.get(output.request_id)
            if state is None:
                continue
            if "prefill_done_s" not in state.timings:
                state.mark("prefill_done_s")
                seq = self.engine.seqs.get(output.seq_id)
                state.cached_at_submit = getattr(seq, "num_cached_tokens", 0) if seq is not None else 0
            state.add_tokens(output.text_token, output.audio_token)
            delta = state.text_delta(self.stack.tokenizer, final=output.finished)
            if delta is not None:
                state.handle.deliver(delta)
            if output.finished:
                state.llm_done, state.finish_reason = True, output.finish_reason
                if output.error:
                    self._end(state, "failed", output.error)
        self._run_detok()
        if outputs:
            self.min_free_blocks = min(self.min_free_blocks, self.engine.block_manager.num_free_blocks)
            if self.record_step_times:
                self.step_times.append(time.perf_counter() - self._iteration_start)
        for state in [s for s in self._turns.values() if s.llm_done and not _has_audio_left(s)]:
            self._end(state, "cancelled" if state.finish_reason == "abort" else "completed", None)
        return bool(self._turns)

    def _run_detok(self) -> None:
        """The chunks now due, of up to detok.max_batch_sessions sessions, most urgent first,
        in one batch (a finished turn flushes all of its own)."""
        due = [s for s in self._turns.values() if s.detok is not None and s.detok.ready(s.llm_done)]
        if due:  # a session with audio buffered can wait: the LLM step it would delay is everyone's
            cfg = self.config.detok
            due = chunks_to_run(due, time.perf_counter(), self.engine.has_work(), cfg.run_ahead_s,
                                cfg.max_batch_sessions)
        if not due:
            return
        try:
            wavs = self.stack.detokenizer.step_batch([(s.detok, [], s.llm_done) for s in due])
        except Exception as exc:  # e.g. out of GPU memory: these turns fail, the server goes on
            log.exception("detokenizer failed")
            for state in due:  # their chunks' tokens are spent: the audio cannot be made whole
                self._end(state, "failed", f"detokenizer failed: {exc}")
            return
        self._note_batch("detok", sum(1 for w in wavs if w.numel()))
        for state, wav in zip(due, wavs):
            chunk = state.audio_chunk(wav)
            if chunk is not None:
                state.handle.deliver(chunk)

    def _end(self, state: TurnState, status: str, error: str | None) -> None:
        self._turns.pop(state.request_id, None)
        if not state.llm_done and state.seq_id is not None:
            self.engine.abort(state.seq_id)
        cached = state.cached_at_submit
        state.handle.deliver(state.finish(status, error, state.prompt_len - cached, cached))

    def _remember(self, key: bytes, value) -> None:
        self._encoded[key] = value
        self._encoded.move_to_end(key)
        while len(self._encoded) > ENCODE_CACHE_SIZE:
            self._encoded.popitem(last=False)

    def _note_batch(self, stage: str, size: int) -> None:
        if size:
            self.last_batch[stage] = size
            self.max_batch[stage] = max(self.max_batch[stage], size)


def configure_worker_thread(device: torch.device, threads: int) -> None:
    """The calling thread's torch settings for model work: engine.cpu_threads (0 = torch's
    default) on the CPU (torch's intra-op thread count is per thread: this sets the caller's
    alone); on cuda:N the current device, which is per thread too and which sdpa reads to
    pick its kernel (every tensor names its device, so nothing else needs it)."""
    if device.type == "cpu" and threads > 0:
        torch.set_num_threads(threads)
    elif device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)


def _has_audio_left(state: TurnState) -> bool:
    """A finished turn's last chunks have not run yet (its session was not among the most urgent)."""
    return state.detok is not None and state.detok.ready(True)


def _audio_key(pcm: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(pcm, dtype=np.float32).tobytes(), digest_size=16).digest()
