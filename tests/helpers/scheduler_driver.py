"""A scheduler driven without a model: sequences for it and a fake runner that checks KV.

The fake runner plays the model: it writes, for every computed position, a key of that
position's whole causal context into a dict "KV pool" at the slot the block table gives, and
before each sample checks that every position of the sequence holds its own key. So shared
prefix blocks, preemption, chunking and abort are checked for wrong K/V, not only counts.
"""

from __future__ import annotations

from kimiaudio.engine.block_manager import BlockManager
from kimiaudio.engine.scheduler import Scheduler

from helpers.sequences import make_sequence

BS = 4
AUDIO_DELAY = 2


def make_seq(seq_id, audio, max_new=3, digests=None, use_text=None, text=None, priority=0, output_type="text"):
    """A sequence of this driver's block size (a "both" one awaits its first audio for
    AUDIO_DELAY steps)."""
    return make_sequence(
        seq_id,
        audio,
        block_size=BS,
        max_new=max_new,
        text=text,
        use_text=use_text,
        digests=digests,
        priority=priority,
        output_type=output_type,
        audio_delay=AUDIO_DELAY,
    )


def next_token(audio, text):
    """The fake model's deterministic "sample": a function of the whole context."""
    return (sum((i + 1) * (a * 31 + t) for i, (a, t) in enumerate(zip(audio, text))) % 97) + 1


def expected_tokens(prompt, max_new, text=7):
    audio, texts, out = list(prompt), [text] * len(prompt), []
    for _ in range(max_new):
        tok = next_token(audio, texts)
        out.append(tok)
        audio.append(tok + 1)
        texts.append(tok)
    return out


class FakeRunner:
    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.bm = scheduler.block_manager
        self.pool: dict[int, tuple] = {}
        self.generated: dict[int, list[int]] = {}
        self.steps: list[list[tuple[int, int]]] = []  # per step: (seq_id, num_scheduled) in batch order
        self.num_decodes: list[int] = []  # per step: its leading decode rows
        self.num_preempted: list[int] = []  # per step: sequences preempted while it was planned

    def slot(self, seq, p):
        return seq.block_table[p // BS] * BS + p % BS

    def step(self):
        plan = self.scheduler.schedule()
        self.steps.append([(s.seq_id, n) for s, n in plan])
        self.num_decodes.append(plan.num_decodes)
        self.num_preempted.append(plan.num_preempted)
        assert all(n == 1 and not s.is_prefilling for s, n in list(plan)[: plan.num_decodes])  # decodes lead
        assert all(s.is_prefilling for s in plan.seqs[plan.num_decodes :])
        budget = self.scheduler.max_num_batched_tokens - plan.num_decodes
        limit = self.scheduler.max_prefill_tokens_while_decoding
        if plan.num_decodes and limit is not None:
            budget = min(budget, limit)
        assert plan.num_prefill_tokens <= budget
        if plan.num_prefill_tokens < budget:
            # Budget left over: nobody scheduled may have been cut short.
            assert all(n == s.num_pending_tokens for s, n in plan)
        for seq, n in plan:
            keys = list(zip(seq.audio_ids, seq.text_ids))
            for p in range(seq.num_computed_tokens, seq.num_computed_tokens + n):
                self.pool[self.slot(seq, p)] = tuple(keys[: p + 1])
        for seq in self.scheduler.postprocess(plan):
            keys = list(zip(seq.audio_ids, seq.text_ids))
            for p in range(seq.num_tokens):
                assert self.pool[self.slot(seq, p)] == tuple(keys[: p + 1]), f"seq {seq.seq_id} pos {p}"
            tok = next_token(seq.audio_ids, seq.text_ids)
            self.generated.setdefault(seq.seq_id, []).append(tok)
            finished = seq.rules.step(tok, tok + 1)[2]  # the length limit: ignore_eos
            seq.append_token(tok, tok + 1)
            if finished:
                self.scheduler.finish(seq)
        return plan

    def run(self, max_steps=500):
        for _ in range(max_steps):
            if not self.scheduler.has_work:
                return
            self.step()
        raise AssertionError("scheduler did not finish")


def assert_pool_idle(bm: BlockManager):
    assert bm.num_free_blocks == bm.num_blocks
    assert not any(bm.ref_counts)
