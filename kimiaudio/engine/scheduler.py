"""Which sequences run in the next step, and how many of their positions (no torch).

Follows nano-vllm's Scheduler, with chunked prefill mixed into decode steps, abort and
preemption done for a server. `schedule()` decides one step from its locals and returns it as
a StepPlan (step_plan.py); `postprocess(plan)` accounts for the computed positions. Per step:
- every running sequence that is decoding gets one position (oldest first), so a long prompt
  never stalls the streams already playing;
- the rest of the token budget (max_num_batched_tokens) goes to prefill chunks, and while
  any sequence decodes, at most max_prefill_tokens_while_decoding positions of it, so that a
  long prompt arriving does not stretch the steps (and the token rate) of the streams already
  playing;
- prefill chunks go first to the spoken answers still waiting for their first audio (their
  listeners hear nothing until then), then to the other sequences of their priority (a
  text-only answer, an answer already playing that is prefilled again after a preemption);
  within each group: sequences part-way through their prefill, then waiting sequences in
  arrival order, each admitted only if the pool has free blocks for all its current
  positions (prefix-cache hits count as already computed; a prompt's blocks are matched
  against the cache at most once per step). A waiting sequence that cannot be admitted
  stops admissions for the step (first come, first served);
- when a decoding sequence needs a new block and none is free, the newest running sequence
  is preempted by recompute: its blocks are freed (their prefix-cache hashes survive) and it
  goes back to the front of the waiting queue, to be prefilled again over its prompt plus
  every token generated so far; the sampled results do not change. A step that preempts
  admits nobody (it would only thrash);
- `abort` frees a sequence's blocks at once, wherever it is;
- priorities (request.py: answers, then background work such as transcribing the user's
  words): each step serves the levels in order, decodes then prefill chunks of each, so
  background work gets only what the answers leave of the budget and the sequence slots;
  an answer waiting for admission preempts background sequences for the blocks or the slot
  it needs, and a background sequence is always the first victim of a preemption. None is
  preempted when all of them together could not make the room.
"""

from __future__ import annotations

from collections import deque

from kimiaudio.engine.block_manager import BlockManager
from kimiaudio.engine.request import RequestError
from kimiaudio.engine.sequence import Sequence, SequenceStatus
from kimiaudio.engine.step_plan import StepPlan


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_prefill_tokens_while_decoding: int | None = None,
    ):
        """max_prefill_tokens_while_decoding: None = no limit beyond the step's budget."""
        if max_num_seqs <= 0 or max_num_batched_tokens <= 0:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive")
        if max_prefill_tokens_while_decoding is not None and max_prefill_tokens_while_decoding <= 0:
            raise ValueError("max_prefill_tokens_while_decoding must be positive (or None)")
        self.block_manager = block_manager
        # Never more running sequences than budget tokens: every decode runs in every step.
        self.max_num_seqs = min(max_num_seqs, max_num_batched_tokens)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_prefill_tokens_while_decoding = max_prefill_tokens_while_decoding
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order, oldest first
        self.num_preemptions = 0
        self.num_cached_prefill_tokens = 0  # positions served from the prefix cache at admission

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        needed = seq.num_blocks_for(seq.max_num_tokens)
        if needed > self.block_manager.num_blocks:
            pool = self.block_manager.num_blocks * self.block_manager.block_size
            raise RequestError(
                f"request {seq.request_id}: up to {seq.max_num_tokens} positions (prompt + "
                f"max_new_tokens) do not fit the KV pool of {pool} positions"
            )
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        """Remove seq wherever it is and free its blocks now."""
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.block_manager.free(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED

    def finish(self, seq: Sequence) -> None:
        """A running sequence is done: register its last full blocks, then free them."""
        self.block_manager.hash_blocks(seq)
        self.abort(seq)

    def schedule(self) -> StepPlan:
        """Plan the next step (empty when there is nothing to do)."""
        plan = StepPlan()
        decoding = any(not s.is_prefilling for s in self.running)
        cap = self.max_prefill_tokens_while_decoding if decoding else None
        admitting = True
        for level in sorted({s.priority for s in self.running} | {s.priority for s in self.waiting}):
            if self._schedule_decodes(level, plan):
                admitting = False  # the pool ran short: admitting now would only thrash
            admitting = self._schedule_prefills(level, plan, cap, admitting)
        return plan

    def postprocess(self, plan: StepPlan) -> list[Sequence]:
        """Account for the computed positions; return the sequences that now sample a token,
        in batch order."""
        sampling = []
        for seq, num_tokens in plan:
            seq.num_computed_tokens += num_tokens
            self.block_manager.hash_blocks(seq)
            if seq.num_computed_tokens == seq.num_tokens:
                seq.is_prefilling = False
                sampling.append(seq)
        return sampling

    def _schedule_decodes(self, level: int, plan: StepPlan) -> bool:
        """One position for every decoding sequence of this priority, oldest first. -> whether
        the pool ran short (something was preempted)."""
        preempted = False
        for seq in list(self.running):
            if seq.priority != level or seq.is_prefilling or seq.status != SequenceStatus.RUNNING:
                continue  # another level, still prefilling, or preempted as a victim just now
            if plan.num_tokens == self.max_num_batched_tokens or len(plan) == self.max_num_seqs:
                break
            while not self.block_manager.can_append(seq):
                victim = self._victim(plan, exclude=seq, level=level)
                self._preempt(victim or seq, plan)
                preempted = True
                if victim is None:
                    break
            else:
                self.block_manager.append_slots(seq)
                plan.add_decode(seq)
        return preempted

    def _schedule_prefills(self, level: int, plan: StepPlan, cap: int | None, admitting: bool) -> bool:
        """Prefill chunks of this priority, answers awaiting their first audio first; in each
        group sequences part-way through their prefill, then admissions in arrival order.
        -> whether later waiting sequences may still be admitted this step."""
        running = [s for s in self.running if s.priority == level and s.is_prefilling]
        waiting = [s for s in self.waiting if s.priority == level]
        for first_audio in (True, False):
            for seq in running:
                room = self._prefill_room(plan, cap)
                if seq.is_awaiting_first_audio == first_audio and room > 0:
                    plan.add_chunk(seq, min(seq.num_pending_tokens, room))
            for seq in waiting:
                if seq.is_awaiting_first_audio != first_audio:
                    continue
                if not admitting or self._prefill_room(plan, cap) == 0:
                    break
                matched = self.block_manager.match_prefix(seq)  # once per candidate and step
                if not self._make_room(seq, matched, level, plan):
                    admitting = False  # first come, first served: later and less urgent ones wait behind it
                    break
                self._admit(seq, matched)
                plan.add_chunk(seq, min(seq.num_pending_tokens, self._prefill_room(plan, cap)))
        return admitting

    def _prefill_room(self, plan: StepPlan, cap: int | None) -> int:
        if len(plan) >= self.max_num_seqs:
            return 0
        room = self.max_num_batched_tokens - plan.num_tokens
        return room if cap is None else min(room, cap - plan.num_prefill_tokens)

    def _admit(self, seq: Sequence, matched: list[int]) -> None:
        self.waiting.remove(seq)
        self.block_manager.allocate(seq, matched)
        seq.num_cached_tokens = seq.num_computed_tokens
        self.num_cached_prefill_tokens += seq.num_cached_tokens
        seq.status = SequenceStatus.RUNNING
        seq.is_prefilling = True
        self.running.append(seq)

    def _make_room(self, seq: Sequence, matched: list[int], level: int, plan: StepPlan) -> bool:
        """Whether `seq` (its cache hits `matched`) can be admitted now: a free sequence slot
        and blocks for its positions, made by preempting less urgent running sequences (newest
        first) where needed. None is preempted when all of them together could not make the
        room (their blocks, an upper bound: blocks shared with others stay): that would only
        throw their work away. Preempting keeps `matched` valid: freed blocks keep their hash
        until a later allocation."""
        candidates = self._candidates(plan, exclude=seq, level=level + 1)
        missing_blocks = self.block_manager.num_blocks_to_allocate(seq, matched) - self.block_manager.num_free_blocks
        missing_slots = len(self.running) - self.max_num_seqs + 1
        if missing_slots > len(candidates) or missing_blocks > sum(len(s.block_table) for s in candidates):
            return False
        while len(self.running) >= self.max_num_seqs or not self.block_manager.can_allocate(seq, matched):
            victim = self._victim(plan, exclude=seq, level=level + 1)
            if victim is None:
                return False
            self._preempt(victim, plan)
        return True

    def _victim(self, plan: StepPlan, exclude: Sequence, level: int) -> Sequence | None:
        """The running sequence to preempt: unscheduled, of priority `level` or less urgent,
        the least urgent first and among those the newest."""
        candidates = self._candidates(plan, exclude, level)
        if not candidates:
            return None
        order = {s.seq_id: i for i, s in enumerate(self.running)}
        return max(candidates, key=lambda s: (s.priority, order[s.seq_id]))

    def _candidates(self, plan: StepPlan, exclude: Sequence, level: int) -> list[Sequence]:
        """Running sequences that may be preempted: unscheduled, of priority `level` or less urgent."""
        taken = {s.seq_id for s in plan.seqs}
        return [s for s in self.running if s is not exclude and s.seq_id not in taken and s.priority >= level]

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        plan.num_preempted += 1
