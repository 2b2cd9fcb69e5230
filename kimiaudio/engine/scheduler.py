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
- `abort` frees a sequence's blocks at once, wherever it is;
- priorities (engine_io: answers, then background work such as transcribing the user's
  words): each step serves the levels in order, decodes then prefill chunks of each, so
  background work gets only what the answers leave of the budget and the sequence slots;
  an answer waiting for admission preempts background sequences for the blocks or the slot
  it needs, and a background sequence is always the first victim of a preemption.
"""

from __future__ import annotations

from collections import deque

from kimiaudio.engine.block_manager import BlockManager
from kimiaudio.engine.engine_io import RequestError
from kimiaudio.engine.sequence import Sequence, SequenceStatus


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
        seq.num_scheduled_tokens = 0

    def finish(self, seq: Sequence) -> None:
        """A running sequence is done: register its last full blocks, then free them."""
        self.block_manager.hash_blocks(seq)
        self.abort(seq)

    def schedule(self) -> list[Sequence]:
        """Pick this step's sequences; each gets num_scheduled_tokens > 0. Priority level by
        level (answers first, background work after): its decodes, then its prefill chunks."""
        self._budget = self.max_num_batched_tokens
        self._prefill_left: int | None = None  # the prefill cap's remainder while something decodes
        self._preempted = False  # the pool ran short this step: admitting now would only thrash
        self._admitting = True  # false once a more urgent waiting sequence could not be admitted
        self._num_decodes = 0
        scheduled: list[Sequence] = []
        levels = sorted({s.priority for s in self.running} | {s.priority for s in self.waiting})
        for level in levels:
            self._schedule_decodes(level, scheduled)
            decoding_later = any(s.priority > level and not s.is_prefilling for s in self.running)
            if (
                self._prefill_left is None
                and (self._num_decodes or decoding_later)
                and self.max_prefill_tokens_while_decoding is not None
            ):
                self._prefill_left = self.max_prefill_tokens_while_decoding
            self._schedule_prefills(level, scheduled)
        return scheduled

    def _schedule_decodes(self, level: int, scheduled: list[Sequence]) -> None:
        """One position for every decoding sequence of this priority, oldest first."""
        for seq in list(self.running):
            if seq.priority != level or seq.is_prefilling or seq.status != SequenceStatus.RUNNING:
                continue  # another level, still prefilling, or preempted as a victim just now
            if self._budget == 0 or len(scheduled) == self.max_num_seqs:
                break
            while not self.block_manager.can_append(seq):
                victim = self._victim(scheduled, exclude=seq, level=level)
                self._preempt(victim or seq)
                self._preempted = True
                if victim is None:
                    break
            else:
                self.block_manager.append_slots(seq)
                seq.num_scheduled_tokens = 1
                self._budget -= 1
                self._num_decodes += 1
                scheduled.append(seq)

    def _prefill_room(self, scheduled: list[Sequence]) -> int:
        if len(scheduled) >= self.max_num_seqs:
            return 0
        return self._budget if self._prefill_left is None else min(self._budget, self._prefill_left)

    def _take(self, seq: Sequence, scheduled: list[Sequence]) -> None:
        taken = self._schedule_chunk(seq, self._prefill_room(scheduled), scheduled)
        self._budget -= taken
        if self._prefill_left is not None:
            self._prefill_left -= taken

    def _schedule_prefills(self, level: int, scheduled: list[Sequence]) -> None:
        """Prefill chunks of this priority: sequences part-way through their prefill, then
        new admissions in arrival order. An admission may preempt background work for the
        blocks or the sequence slot it needs, never the other way round."""
        for seq in self.running:
            if seq.priority == level and seq.is_prefilling and self._prefill_room(scheduled) > 0:
                self._take(seq, scheduled)
        for seq in [s for s in self.waiting if s.priority == level]:
            if not self._admitting or self._preempted or self._prefill_room(scheduled) == 0:
                return
            if not self._make_room(seq, level, scheduled):
                self._admitting = False  # first come, first served: later and less urgent ones wait behind it
                return
            self.waiting.remove(seq)
            matched = self.block_manager.match_prefix(seq)
            self.block_manager.allocate(seq, matched)
            seq.num_cached_tokens = seq.num_computed_tokens
            self.num_cached_prefill_tokens += seq.num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            seq.is_prefilling = True
            self.running.append(seq)
            self._take(seq, scheduled)

    def _make_room(self, seq: Sequence, level: int, scheduled: list[Sequence]) -> bool:
        """Whether `seq` can be admitted now: a free sequence slot and blocks for its positions,
        made by preempting less urgent running sequences (newest first) where needed. None is
        preempted when all of them together could not make the room (their blocks, an upper
        bound: blocks shared with others stay): that would only throw their work away."""
        candidates = self._candidates(scheduled, exclude=seq, level=level + 1)
        missing_blocks = (
            self.block_manager.num_blocks_to_allocate(seq, self.block_manager.match_prefix(seq))
            - self.block_manager.num_free_blocks
        )
        missing_slots = len(self.running) - self.max_num_seqs + 1
        if missing_slots > len(candidates) or missing_blocks > sum(len(s.block_table) for s in candidates):
            return False
        while len(self.running) >= self.max_num_seqs or not self.block_manager.can_allocate(
            seq, self.block_manager.match_prefix(seq)
        ):
            victim = self._victim(scheduled, exclude=seq, level=level + 1)
            if victim is None:
                return False
            self._preempt(victim)
        return True

    def _schedule_chunk(self, seq: Sequence, budget: int, scheduled: list[Sequence]) -> int:
        seq.num_scheduled_tokens = min(seq.num_pending_tokens, budget)
        scheduled.append(seq)
        return seq.num_scheduled_tokens

    def _victim(self, scheduled: list[Sequence], exclude: Sequence, level: int) -> Sequence | None:
        """The running sequence to preempt: unscheduled, of priority `level` or less urgent,
        the least urgent first and among those the newest."""
        candidates = self._candidates(scheduled, exclude, level)
        if not candidates:
            return None
        order = {s.seq_id: i for i, s in enumerate(self.running)}
        return max(candidates, key=lambda s: (s.priority, order[s.seq_id]))

    def _candidates(self, scheduled: list[Sequence], exclude: Sequence, level: int) -> list[Sequence]:
        """Running sequences that may be preempted: unscheduled, of priority `level` or less urgent."""
        taken = {s.seq_id for s in scheduled}
        return [s for s in self.running if s is not exclude and s.seq_id not in taken and s.priority >= level]

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
