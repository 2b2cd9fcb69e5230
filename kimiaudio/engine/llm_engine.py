"""The engine: requests in, one (text, audio) token pair per request per step out.

Follows nano-vllm's LLMEngine: `add_request` turns a validated EngineRequest into a
Sequence (input_processor.py), `step` = schedule, run the model, apply each request's
official generation rules (stop_rules.StreamRules) to its samples, feed the tokens back,
free finished sequences.
Steps overlap (vLLM's async scheduling, SGLang's overlap scheduler): `step` plans and
launches the next step from the previous one's samples still on the device, then reads
those, so a step's outputs may come from the call after the one that launched it (see `step`).
A bad request fails alone (RequestError from add_request); a step that raises fails only the
sequences it ran. Each StepOutput carries what callers need (see engine/step_output.py), so they
never read the engine's sequences or block manager. Not thread-safe: one owner thread (the
pipeline's LM worker).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch

from kimiaudio.config import EngineConfig
from kimiaudio.engine.block_manager import BlockManager
from kimiaudio.engine.input_processor import new_sequence
from kimiaudio.engine.launched_step import LaunchedStep, StepSample
from kimiaudio.engine.model_runner import ModelRunner
from kimiaudio.engine.request import EngineRequest
from kimiaudio.engine.scheduler import Scheduler
from kimiaudio.engine.sequence import Sequence, SequenceStatus
from kimiaudio.engine.step_output import Completion, StepOutput
from kimiaudio.engine.step_plan import StepPlan
from kimiaudio.models.kimia_lm import KimiAudioLM

log = logging.getLogger(__name__)


class InFlight(NamedTuple):
    """A launched step and its number (EngineStats.num_steps when it was planned)."""

    launched: LaunchedStep
    step: int


@dataclass(frozen=True)
class EngineStats:
    num_blocks_total: int
    num_blocks_free: int
    num_running: int
    num_waiting: int
    num_prefill_tokens_computed: int  # prompt (and re-prefill) positions run through the model
    num_prefill_tokens_cached: int  # prompt positions served from the prefix cache instead
    num_decode_tokens: int
    num_preemptions: int
    num_steps: int
    # Seconds the host spent blocked reading launched steps' samples: where a step's time is the
    # device's beyond the host's own work (a slow step that waited long was slow on the device).
    read_wait_s: float = 0.0


class LLMEngine:
    def __init__(
        self,
        lm: KimiAudioLM,
        config: EngineConfig,
        device: torch.device | str,
        dtype: torch.dtype,
        num_blocks: int | None = None,
    ):
        """num_blocks: the KV pool's usable blocks, as the memory plan sized them (ModelRunner)."""
        self.lm = lm
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        self.runner = ModelRunner(lm, config, self.device, dtype, num_blocks)
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size)
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.max_prefill_tokens_while_decoding,
        )
        self.seqs: dict[int, Sequence] = {}
        self._seq_ids = itertools.count()
        self._pending: list[StepOutput] = []  # outputs decided outside a step (e.g. zero-length)
        self._launched: InFlight | None = None  # a step whose samples are not read yet
        self._num_prefill_computed = 0
        self._num_decode = 0
        self._num_steps = 0
        self._read_wait_s = 0.0

    @property
    def max_sequence_len(self) -> int:
        """The positions one sequence may hold: engine.max_model_len, or the whole KV pool where
        that holds fewer (a small engine.num_kv_blocks). Prompts and answers are held to it, so
        no request fails for want of a pool it could never have."""
        return min(self.config.max_model_len, self.block_manager.num_blocks * self.config.block_size)

    def add_request(self, request: EngineRequest) -> int:
        """Validate and queue a request; raises RequestError (for this request only)."""
        seq = new_sequence(
            next(self._seq_ids), request, self.lm.config, self.config, self.max_sequence_len, self.device, self.dtype
        )
        if seq.rules.is_finished:  # the length limit allows no step at all
            self._pending.append(self._output(seq, None, None, True, seq.rules.finish_reason))
            return seq.seq_id
        self.scheduler.add(seq)
        self.seqs[seq.seq_id] = seq
        return seq.seq_id

    def abort(self, seq_id: int) -> bool:
        """Stop a request and free its KV blocks now; False if it is not (or no longer) live."""
        seq = self.seqs.pop(seq_id, None)
        if seq is None:
            return False
        self.scheduler.abort(seq)
        seq.finish_reason = "abort"
        return True

    def has_work(self) -> bool:
        return bool(self._pending) or self.scheduler.has_work or self._launched is not None

    def release(self) -> None:
        """Give the KV pool and the decode graphs' memory back, once no step will run again
        (a stopped pipeline): a pipeline built next in the same process plans without them."""
        self._launched = None
        self.runner.release()

    def step(self) -> list[StepOutput]:
        """Run one step; -> the outputs of every step whose samples were read in this call.

        A step that samples on the device is launched, not read (LaunchedStep). The next call
        plans the next step before reading it (`_may_plan_ahead`); if that plan is one a launch
        runs too, it is launched first, from the samples on the device, and the step in flight
        is read after, so the host's work overlaps the device's. Any other plan (host-side
        sampling) runs once the step in flight is read, without the sequences that ended in
        it. A sequence that stopped in the step read last ran one more row in the step launched
        before it: that row's output is dropped."""
        outputs, self._pending = self._pending, []
        previous, self._launched = self._launched, None
        if previous is not None and not self._may_plan_ahead():
            outputs += self._read(previous)
            previous = None
        plan = self.scheduler.schedule()
        launch = bool(plan) and self.runner.can_launch(plan)
        if previous is not None and not launch:
            outputs += self._read(previous)  # the plan needs the host to know its tokens
            previous = None
            plan = plan.without([seq for seq in plan.seqs if seq.is_finished])
        if plan:
            self._num_steps += 1
            self._num_prefill_computed += plan.num_prefill_tokens
            self._num_decode += plan.num_tokens - plan.num_prefill_tokens
            outputs += self._launch(plan, previous) if launch else self._run(plan)
        if previous is not None:
            outputs += self._read(previous)
        return outputs

    def _may_plan_ahead(self) -> bool:
        """Whether the next step may be planned before the step in flight is read: none of its
        sequences ends by its length in it (planning on would spend a row, perhaps a block, on
        it), and every running sequence's next position has its block free (planning on would
        otherwise preempt on what is not known yet)."""
        running = self.scheduler.running
        return not any(
            seq.num_unresolved and seq.rules.next_step_is_last for seq in running
        ) and self.block_manager.can_append_all(running)

    def _launch(self, plan: StepPlan, previous: InFlight | None) -> list[StepOutput]:
        try:
            launched = self.runner.launch(plan, None if previous is None else previous.launched)
        except Exception as exc:  # a broken step fails the requests in it, not the server
            return self._fail_step(plan.seqs, exc)
        self._computed(plan)
        self._launched = InFlight(launched, self._num_steps)
        return []

    def _run(self, plan: StepPlan) -> list[StepOutput]:
        try:
            samples = self.runner.run(plan)
        except Exception as exc:
            return self._fail_step(plan.seqs, exc)
        sampling = self._computed(plan)
        return [self._apply(seq, sampled, self._num_steps) for seq, sampled in zip(sampling, samples)]

    def _computed(self, plan: StepPlan) -> list[Sequence]:
        """Account for the plan's positions; each sequence that sampled gets its next position,
        unresolved until its samples are read (`_apply`). -> those sequences, in batch order."""
        sampling = self.scheduler.postprocess(plan)
        for seq in sampling:
            seq.append_unresolved()
        return sampling

    def _read(self, in_flight: InFlight) -> list[StepOutput]:
        """The launched step's outputs, for the sequences still live."""
        launched = in_flight.launched
        start = time.perf_counter()
        try:
            samples = launched.read()
        except Exception as exc:
            return self._fail_step([seq for seq in launched.seqs if self._is_live(seq)], exc)
        finally:
            self._read_wait_s += time.perf_counter() - start
        return [
            self._apply(seq, sampled, in_flight.step)
            for seq, sampled in zip(launched.seqs, samples)
            if self._is_live(seq)
        ]

    def _apply(self, seq: Sequence, sampled: StepSample, step: int) -> StepOutput:
        """The official rules over one sequence's samples: its fed-back ids resolved, its end."""
        text, audio, finished, reason = seq.rules.step(sampled.text, sampled.audio)
        seq.resolve(text, audio)
        if finished:
            seq.finish_reason = reason
            self.scheduler.finish(seq)
            del self.seqs[seq.seq_id]
        output = self._output(seq, text, audio, finished, reason)
        output.step = step
        if text == sampled.text:  # the sampled token itself, not one the rules forced
            output.text_logprob, output.text_top = sampled.text_logprob, sampled.text_top
        return output

    def _fail_step(self, seqs: list[Sequence], exc: Exception) -> list[StepOutput]:
        log.exception("engine step failed", exc_info=exc)
        return [self._fail(seq, f"engine step failed: {type(exc).__name__}: {exc}") for seq in seqs]

    def _is_live(self, seq: Sequence) -> bool:
        """Not finished, failed or aborted since its step was launched."""
        return self.seqs.get(seq.seq_id) is seq

    def stats(self) -> EngineStats:
        return EngineStats(
            num_blocks_total=self.block_manager.num_blocks,
            num_blocks_free=self.block_manager.num_free_blocks,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_prefill_tokens_computed=self._num_prefill_computed,
            num_prefill_tokens_cached=self.scheduler.num_cached_prefill_tokens,
            num_decode_tokens=self._num_decode,
            num_preemptions=self.scheduler.num_preemptions,
            num_steps=self._num_steps,
            read_wait_s=self._read_wait_s,
        )

    def _fail(self, seq: Sequence, error: str) -> StepOutput:
        self.seqs.pop(seq.seq_id, None)
        if seq.status != SequenceStatus.FINISHED:
            self.scheduler.abort(seq)
        seq.finish_reason, seq.error = "error", error
        return self._output(seq, None, None, True, "error", error)

    @staticmethod
    def _output(
        seq: Sequence, text: int | None, audio: int | None, finished: bool, reason: str | None, error: str | None = None
    ) -> StepOutput:
        completion = None
        if finished and error is None:
            rules = seq.rules
            completion = Completion(rules.text_tokens, rules.audio_tokens, rules.num_steps)
        return StepOutput(
            seq.request_id,
            seq.seq_id,
            text,
            audio,
            finished,
            reason,
            error,
            seq.num_prompt_tokens,
            seq.num_cached_tokens,
            completion,
        )
