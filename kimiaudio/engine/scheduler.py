"""Which sequences run in the next step, and how many of their positions (no torch).

Follows nano-vllm's Scheduler, with chunked prefill mixed into decode steps, abort and
preemption done for a server:
- every step first schedules one position for each running sequence that is decoding
  (oldest first), so a long prompt never stalls the streams already playing;
- the rest of the token budget (max_num_batched_tokens) goes to prefill chunks: running
  sequences part-way through their prefill, then waiting sequences in arrival order, each
  admitted only if the pool has free blocks for all its current positions (prefix-cache hits
  count as already computed); while any sequence decodes, prefill chunks get at most
  max_prefill_tokens_while_decoding positions per step, so that a long prompt arriving does
  not stretch the steps (and the token rate) of the streams already playing;
- when a decoding sequence needs a new block and none is free, the newest running sequence
  is preempted by recompute: its blocks are freed (their prefix-cache hashes survive) and it
  goes back to the front of the waiting queue, to be prefilled again over its prompt plus
  every token generated so far; the sampled results do not change;
- `abort` frees a sequence's blocks at once, wherever it is.
"""

from __future__ import annotations

from collections import deque

from kimiaudio.engine.block_manager import BlockManager
from kimiaudio.engine.sequence import Sequence, SequenceStatus
from kimiaudio.engine.engine_io import RequestError


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_prefill_tokens_while_decoding: int | None = None):
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
            raise RequestError(f"request {seq.request_id}: up to {seq.max_num_tokens} positions (prompt + "
                               f"max_new_tokens) do not fit the KV pool of {pool} positions")
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
        seq.num_scheduled_tokens = 0

    def finish(self, seq: Sequence) -> None:
        """A running sequence is done: register its last full blocks, then free them."""
        self.block_manager.hash_blocks(seq)
        self.abort(seq)

    def schedule(self) -> list[Sequence]:
        """Pick this step's sequences; each gets num_scheduled_tokens > 0. Decodes come first."""
        budget = self.max_num_batched_tokens
        scheduled: list[Sequence] = []
        preempted = False

        # 1. One position for every decoding sequence, oldest first.
        for seq in list(self.running):
            if seq.is_prefilling or seq.status != SequenceStatus.RUNNING:
                continue  # still prefilling (step 2), or preempted as a victim just now
            if budget == 0 or len(scheduled) == self.max_num_seqs:
                break
            while not self.block_manager.can_append(seq):
                victim = self._newest_unscheduled(scheduled, exclude=seq)
                self._preempt(victim or seq)
                preempted = True
                if victim is None:
                    break
            else:
                self.block_manager.append_slots(seq)
                seq.num_scheduled_tokens = 1
                budget -= 1
                scheduled.append(seq)

        # 2. Prefill chunks: sequences part-way through their prefill, then new admissions.
        if scheduled and self.max_prefill_tokens_while_decoding is not None:
            budget = min(budget, self.max_prefill_tokens_while_decoding)
        for seq in self.running:
            if seq.is_prefilling and budget > 0 and len(scheduled) < self.max_num_seqs:
                budget -= self._schedule_chunk(seq, budget, scheduled)
        # After a preemption the pool is short: admitting now would only thrash.
        while self.waiting and not preempted and budget > 0 and len(scheduled) < self.max_num_seqs \
                and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            matched = self.block_manager.match_prefix(seq)
            if not self.block_manager.can_allocate(seq, matched):
                break  # first come, first served: later arrivals wait behind it
            self.waiting.popleft()
            self.block_manager.allocate(seq, matched)
            seq.num_cached_tokens = seq.num_computed_tokens
            self.num_cached_prefill_tokens += seq.num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            seq.is_prefilling = True
            self.running.append(seq)
            budget -= self._schedule_chunk(seq, budget, scheduled)
        return scheduled

    def _schedule_chunk(self, seq: Sequence, budget: int, scheduled: list[Sequence]) -> int:
        seq.num_scheduled_tokens = min(seq.num_pending_tokens, budget)
        scheduled.append(seq)
        return seq.num_scheduled_tokens

    def _newest_unscheduled(self, scheduled: list[Sequence], exclude: Sequence) -> Sequence | None:
        taken = {s.seq_id for s in scheduled}
        for seq in reversed(self.running):
            if seq is not exclude and seq.seq_id not in taken:
                return seq
        return None

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_scheduled_tokens = 0
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def postprocess(self, scheduled: list[Sequence]) -> list[Sequence]:
        """Account for the computed positions; return the sequences that now sample a token."""
        sampling = []
        for seq in scheduled:
            seq.num_computed_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            self.block_manager.hash_blocks(seq)
            if seq.num_computed_tokens == seq.num_tokens:
                seq.is_prefilling = False
                sampling.append(seq)
        return sampling
