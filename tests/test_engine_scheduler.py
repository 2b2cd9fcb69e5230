"""Block manager and scheduler without a model (tests/helpers/scheduler_driver.py's fake
runner checks the K/V of every slot, not only counts)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kimiaudio.engine.block_manager import BlockManager
from kimiaudio.engine.request import RequestError
from kimiaudio.engine.scheduler import Scheduler
from kimiaudio.engine.sequence import SequenceStatus

from helpers.scheduler_driver import BS, FakeRunner, assert_pool_idle, expected_tokens, make_seq


def test_refcounts_prefix_hits_and_free():
    bm = BlockManager(16, BS)
    a = make_seq(0, list(range(1, 12)))  # 11 positions: 2 full blocks + 3
    bm.allocate(a, bm.match_prefix(a))
    assert len(a.block_table) == 3 and bm.num_free_blocks == 13 and a.num_computed_tokens == 0
    a.num_computed_tokens = 11
    bm.hash_blocks(a)
    assert a.num_hashed_blocks == 2
    b = make_seq(1, list(range(1, 12)) + [50, 51])  # extends a's prompt
    matched = bm.match_prefix(b)
    assert matched == a.block_table[:2]
    bm.allocate(b, matched)
    assert b.num_computed_tokens == 2 * BS
    assert [bm.ref_counts[i] for i in a.block_table] == [2, 2, 1]
    assert bm.num_free_blocks == 16 - 3 - 2
    bm.free(a)
    assert [bm.ref_counts[i] for i in b.block_table[:2]] == [1, 1]
    bm.free(b)
    assert_pool_idle(bm)


def test_match_leaves_one_position_to_compute():
    bm = BlockManager(8, BS)
    a = make_seq(0, list(range(1, 9)))  # exactly 2 full blocks
    bm.allocate(a, [])
    a.num_computed_tokens = 8
    bm.hash_blocks(a)
    bm.free(a)
    assert len(bm.match_prefix(make_seq(1, list(range(1, 9))))) == 1
    assert len(bm.match_prefix(make_seq(2, list(range(1, 10))))) == 2


@pytest.mark.parametrize("change", ["audio", "text", "use_text", "digest"])
def test_prefix_key_covers_both_streams_flags_and_features(change):
    bm = BlockManager(8, BS)
    digests = [None, "f1", "f2", None, None, None, None, None, None]
    a = make_seq(0, list(range(1, 10)), digests=digests)
    bm.allocate(a, [])
    a.num_computed_tokens = 9
    bm.hash_blocks(a)
    audio, text, use_text, dig = list(range(1, 10)), [7] * 9, [True] * 9, list(digests)
    if change == "audio":
        audio[5] = 99
    elif change == "text":
        text[5] = 8
    elif change == "use_text":
        use_text[5] = False
    else:
        dig[2] = "other"
    b = make_seq(1, audio, digests=dig, use_text=use_text, text=text)
    # The change is in block 1 (digest: block 0); earlier blocks still hit.
    assert len(bm.match_prefix(b)) == (0 if change == "digest" else 1)
    assert len(bm.match_prefix(make_seq(2, list(range(1, 10)), digests=digests))) == 2


def test_hash_collision_is_a_miss():
    bm = BlockManager(8, BS)
    bm.compute_hash = lambda prefix, key: b"same-hash-for-everything"
    a = make_seq(0, [1, 2, 3, 4, 5])
    bm.allocate(a, [])
    a.num_computed_tokens = 5
    bm.hash_blocks(a)
    assert bm.match_prefix(make_seq(1, [9, 9, 9, 9, 5])) == []  # same hash, other contents
    assert bm.match_prefix(make_seq(2, [1, 2, 3, 4, 6])) == a.block_table[:1]


def test_lazy_eviction_reuses_empty_blocks_first_then_least_recently_freed():
    bm = BlockManager(4, BS)
    a = make_seq(0, list(range(1, 10)))  # 3 blocks, 2 full
    bm.allocate(a, [])
    a.num_computed_tokens = 9
    bm.hash_blocks(a)
    full = a.block_table[:2]
    bm.free(a)
    assert bm.num_free_blocks == 4 and len(bm.cached_free_ids) == 2
    c = make_seq(1, [60, 61, 62])  # one block: taken from never-hashed blocks
    bm.allocate(c, [])
    assert c.block_table[0] not in full
    assert bm.match_prefix(make_seq(2, list(range(1, 10)))) == full  # still cached
    d = make_seq(3, [70, 71, 72, 73, 74, 75])  # 2 blocks: one empty, then evict one cached
    bm.allocate(d, [])
    # a's blocks were freed tail first, so block 1 (the later one) is evicted before block 0.
    assert full[1] in d.block_table and full[0] not in d.block_table
    assert bm.match_prefix(make_seq(4, list(range(1, 10)))) == full[:1]
    bm.free(c)
    bm.free(d)
    assert_pool_idle(bm)


def test_chunked_prefill_respects_budget():
    sched = Scheduler(BlockManager(32, BS), max_num_seqs=8, max_num_batched_tokens=10)
    runner = FakeRunner(sched)
    sched.add(make_seq(0, list(range(1, 26)), max_new=2))
    runner.run()
    assert runner.steps[:3] == [[(0, 10)], [(0, 10)], [(0, 5)]]
    assert runner.generated[0] == expected_tokens(range(1, 26), 2)
    assert_pool_idle(sched.block_manager)


def test_decodes_first_and_long_prefill_is_chunked():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=6)
    runner = FakeRunner(sched)
    for i in range(3):
        sched.add(make_seq(i, [i + 1, 2, 3], max_new=12))
    runner.step()  # prefills of 3 + 3 positions fill the budget
    runner.step()
    sched.add(make_seq(9, list(range(1, 41)), max_new=2))
    num_chunks = 0
    while sched.has_work:
        decoding = [s.seq_id for s in sched.running if not s.is_prefilling]
        runner.step()
        step = dict(runner.steps[-1])
        if step.get(9, 0) > 1:  # while the long prompt prefills...
            # ...every live decode ran in the same step, the prompt got only the leftover budget.
            num_chunks += 1
            assert all(step.get(s) == 1 for s in decoding)
            assert sum(step.values()) <= 6 and step[9] <= 6 - len(decoding)
    assert num_chunks >= 5  # 40 positions in pieces of at most 6 - live decodes
    assert max(sum(n for _, n in seq_steps) for seq_steps in runner.steps) <= 6
    for i in range(3):
        assert runner.generated[i] == expected_tokens([i + 1, 2, 3], 12)
    assert runner.generated[9] == expected_tokens(range(1, 41), 2)
    assert_pool_idle(sched.block_manager)


def test_prefill_while_decoding_is_limited():
    sched = Scheduler(
        BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=32, max_prefill_tokens_while_decoding=5
    )
    runner = FakeRunner(sched)
    sched.add(make_seq(0, list(range(1, 30)), max_new=20))
    runner.step()
    assert runner.steps[-1] == [(0, 29)]  # nothing decodes: the whole budget
    sched.add(make_seq(1, list(range(100, 140)), max_new=2))  # no prefix shared with seq 0
    sched.add(make_seq(2, list(range(5, 8)), max_new=2))
    while sched.running[-1].seq_id != 2 or sched.running[-1].is_prefilling:
        runner.step()
        step = dict(runner.steps[-1])
        assert step[0] == 1 and sum(n for sid, n in step.items() if sid != 0) <= 5  # the decode, <= 5 prefill
    chunks = [dict(s).get(1, 0) for s in runner.steps[1:]]
    assert chunks[:8] == [5] * 8  # 40 positions in chunks of 5 beside the decode
    runner.run()
    assert runner.generated[0] == expected_tokens(range(1, 30), 20)
    assert runner.generated[1] == expected_tokens(range(100, 140), 2)
    assert runner.generated[2] == expected_tokens(range(5, 8), 2)
    with pytest.raises(ValueError, match="max_prefill_tokens_while_decoding"):
        Scheduler(BlockManager(4, BS), 8, 32, max_prefill_tokens_while_decoding=0)
    assert_pool_idle(sched.block_manager)


def test_preemption_when_pool_runs_out_keeps_results():
    sched = Scheduler(BlockManager(8, BS), max_num_seqs=8, max_num_batched_tokens=16)
    runner = FakeRunner(sched)
    prompts = {i: [i + 1] * (5 + i) for i in range(4)}
    for i, prompt in prompts.items():
        sched.add(make_seq(i, prompt, max_new=10))
    runner.run()
    assert sched.num_preemptions > 0 and sum(runner.num_preempted) == sched.num_preemptions
    for i, prompt in prompts.items():
        assert runner.generated[i] == expected_tokens(prompt, 10)
    assert_pool_idle(sched.block_manager)


def test_generated_positions_use_text_unless_token_is_zero():
    seq = make_seq(0, [1, 2, 3])
    seq.append_token(5, 6)
    seq.append_token(0, 6)  # the reference decode call's text ids sum to 0: no text embedding
    assert seq.use_text == [True, True, True, True, False]
    assert seq.feature_digests[3:] == [None, None] and seq.continuous_mask[3:] == [False, False]


def test_abort_frees_blocks_at_once():
    bm = BlockManager(16, BS)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=64)
    runner = FakeRunner(sched)
    running, waiting = make_seq(0, list(range(1, 10)), max_new=20), make_seq(1, [5] * 30, max_new=20)
    sched.add(running)
    runner.step()
    runner.step()
    sched.add(waiting)
    assert running.status == SequenceStatus.RUNNING and bm.num_free_blocks < 16
    sched.abort(running)
    assert running.status == SequenceStatus.FINISHED and running.block_table == []
    assert bm.num_free_blocks == 16
    sched.abort(waiting)
    assert not sched.has_work
    assert_pool_idle(bm)


def test_request_longer_than_pool_fails_alone():
    sched = Scheduler(BlockManager(4, BS), max_num_seqs=8, max_num_batched_tokens=64)
    with pytest.raises(RequestError, match="do not fit"):
        sched.add(make_seq(0, list(range(1, 15)), max_new=4))  # 17 positions > 16
    ok = make_seq(1, list(range(1, 14)), max_new=4)  # 16 positions: fits exactly
    sched.add(ok)
    runner = FakeRunner(sched)
    runner.run()
    assert runner.generated[1] == expected_tokens(range(1, 14), 4)
    assert_pool_idle(sched.block_manager)


def test_max_num_seqs_limits_running():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=2, max_num_batched_tokens=64)
    runner = FakeRunner(sched)
    for i in range(5):
        sched.add(make_seq(i, [i + 1] * 3, max_new=4))
    while sched.has_work:
        runner.step()
        assert len(sched.running) <= 2
    assert all(runner.generated[i] == expected_tokens([i + 1] * 3, 4) for i in range(5))
    assert_pool_idle(sched.block_manager)


def _answers_with_background(background: bool):
    """Two answers, the second arriving at step 3, in a pool and slot count that fit the
    answers but not the answers and two background (transcription) requests beside them."""
    sched = Scheduler(
        BlockManager(10, BS), max_num_seqs=3, max_num_batched_tokens=8, max_prefill_tokens_while_decoding=4
    )
    runner = FakeRunner(sched)
    answers = {0: list(range(1, 11)), 1: list(range(20, 32))}
    extra = {10: list(range(40, 49)), 11: list(range(60, 69))}
    arrivals = {0: [0] + ([10] if background else []), 1: [11] if background else [], 3: [1]}
    for step in range(500):
        for sid in arrivals.get(step, []):
            prompt = answers.get(sid) or extra[sid]
            seq = make_seq(sid, prompt, max_new=6 if sid in answers else 8, priority=1 if sid in extra else 0)
            sched.add(seq)
        if not sched.has_work and step > 2:
            break
        runner.step()
    return runner, sched


def test_background_priority_never_takes_an_answers_room():
    alone, _ = _answers_with_background(False)
    mixed, sched = _answers_with_background(True)

    def answer_steps(runner):
        return [[(sid, n) for sid, n in step if sid < 10] for step in runner.steps]

    plain = answer_steps(alone)
    # Every step gave each answer exactly the positions it had alone: its prefill chunks,
    # its first token and every decode, at the same step (background work only fills the rest).
    assert answer_steps(mixed)[: len(plain)] == plain
    assert all(not step for step in answer_steps(mixed)[len(plain) :])
    assert any(sid >= 10 for step in mixed.steps[: len(plain)] for sid, _ in step)  # it was batched beside them
    assert sched.num_preemptions > 0  # the answers' arrival took blocks or a slot back from it
    for sid, prompt in {0: range(1, 11), 1: range(20, 32)}.items():
        assert mixed.generated[sid] == alone.generated[sid] == expected_tokens(prompt, 6)
    for sid, prompt in {10: range(40, 49), 11: range(60, 69)}.items():
        assert mixed.generated[sid] == expected_tokens(prompt, 8)  # preempted, recomputed, same tokens
    assert_pool_idle(sched.block_manager)


def test_an_answer_that_cannot_fit_yet_preempts_nothing():
    """An answer whose blocks even every background sequence's together could not free waits
    without preempting them: preempting would throw their work away and still not admit it."""
    sched = Scheduler(BlockManager(10, BS), max_num_seqs=8, max_num_batched_tokens=64)
    runner = FakeRunner(sched)
    first = make_seq(0, list(range(1, 25)), max_new=3)  # 24 positions: 6 of the 10 blocks, then 7
    background = make_seq(10, list(range(40, 44)), max_new=3, priority=1)  # 1 block, then 2
    sched.add(first)
    sched.add(background)
    runner.step()
    assert {s.seq_id for s in sched.running} == {0, 10}
    late = make_seq(1, list(range(60, 80)), max_new=2)  # 5 blocks: more than free + the background's
    sched.add(late)
    runner.step()
    assert sched.num_preemptions == 0 and background in sched.running and late in sched.waiting
    runner.run()  # the late answer gets in once the first one is done
    assert runner.generated[1] == expected_tokens(range(60, 80), 2)
    assert runner.generated[10] == expected_tokens(range(40, 44), 3)
    assert_pool_idle(sched.block_manager)


def test_bookkeeping_imports_no_torch():
    """The scheduler, its plan, sequences, blocks and rules run (and are tested) without torch:
    Sequence names torch and the params' types for type checking only."""
    modules = ("scheduler", "step_plan", "sequence", "block_manager", "stop_rules", "request", "step_output")
    code = ";".join(f"import kimiaudio.engine.{m}" for m in modules) + ";import sys;print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
