"""Turns waiting for their first audio get the prefill budget first (scheduler.py's policy).

Ordered events of the scheduler driven without a model (tests/helpers/scheduler_driver.py):
the same arrivals with the new turn a spoken answer (`both`, awaiting its first audio) and, as
the control, a text-only answer, which keeps its place in arrival order.
"""

from __future__ import annotations

from kimiaudio.engine.block_manager import BlockManager
from kimiaudio.engine.request import BACKGROUND_PRIORITY
from kimiaudio.engine.scheduler import Scheduler

from helpers.scheduler_driver import BS, FakeRunner, assert_pool_idle, expected_tokens, make_seq

CAP = 6  # max_prefill_tokens_while_decoding
PLAYING, TEXT_ANSWER, TRANSCRIPTION, NEW = 0, 1, 2, 3


def prefill_order(runner: FakeRunner, plan_index: int) -> list[int]:
    """The ids of one step's prefill chunks, in the order the scheduler gave them room."""
    return [sid for sid, _ in runner.steps[plan_index][runner.num_decodes[plan_index] :]]


def long_prompts_then_new_turn(new_type: str):
    """A spoken answer already playing; a long text-only answer and a long background
    transcription part-way through their prefill; then a new turn of `new_type` arrives.
    -> (runner, step index at which the new turn arrived)."""
    sched = Scheduler(
        BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=16, max_prefill_tokens_while_decoding=CAP
    )
    runner = FakeRunner(sched)
    playing = make_seq(PLAYING, [1, 2, 3], max_new=40, output_type="both")
    sched.add(playing)
    while playing.is_awaiting_first_audio:
        runner.step()
    sched.add(make_seq(TEXT_ANSWER, list(range(10, 50)), max_new=3))
    sched.add(make_seq(TRANSCRIPTION, list(range(60, 100)), max_new=3, priority=BACKGROUND_PRIORITY))
    runner.step()
    assert dict(runner.steps[-1])[TEXT_ANSWER] == CAP  # part-way through its prefill now
    sched.add(make_seq(NEW, list(range(100, 120)), max_new=8, output_type=new_type))
    arrival = len(runner.steps)
    runner.run()
    assert runner.generated[NEW] == expected_tokens(range(100, 120), 8)
    assert runner.generated[TEXT_ANSWER] == expected_tokens(range(10, 50), 3)
    assert runner.generated[TRANSCRIPTION] == expected_tokens(range(60, 100), 3)
    assert_pool_idle(sched.block_manager)
    return runner, arrival


def steps_with_prefill(runner: FakeRunner, sid: int, since: int) -> list[int]:
    return [i for i in range(since, len(runner.steps)) if sid in prefill_order(runner, i)]


def test_new_turn_prefill_goes_ahead_of_long_prompts_and_decodes_stay():
    runner, arrival = long_prompts_then_new_turn("both")
    new_steps = steps_with_prefill(runner, NEW, arrival)
    # From its arrival on, every step gave the new turn the prefill room first, in full.
    assert new_steps == list(range(arrival, arrival + len(new_steps)))
    pending = 20
    for i in new_steps:
        chunk = dict(runner.steps[i])[NEW]
        assert prefill_order(runner, i)[0] == NEW and chunk == min(pending, CAP)
        pending -= chunk
    assert pending == 0 and len(new_steps) == 4  # 20 positions in chunks of 6
    # The text answer had part of its prompt left and waited; the transcription got nothing.
    assert all(dict(runner.steps[i]).get(TEXT_ANSWER, 0) <= CAP - dict(runner.steps[i])[NEW] for i in new_steps)
    assert not any(TRANSCRIPTION in prefill_order(runner, i) for i in new_steps)
    # The answer already playing decoded in every step meanwhile.
    assert all(dict(runner.steps[i]).get(PLAYING) == 1 for i in range(arrival, new_steps[-1] + 1))


def test_control_a_text_answer_keeps_its_place():
    runner, arrival = long_prompts_then_new_turn("text")
    new_steps = steps_with_prefill(runner, NEW, arrival)
    text_steps = steps_with_prefill(runner, TEXT_ANSWER, arrival)
    assert text_steps[0] == arrival and new_steps[0] > arrival  # behind the text answer's rest
    assert prefill_order(runner, new_steps[0])[0] == TEXT_ANSWER


def preempted_playing_turn_then_new_turn(new_type: str):
    """Two spoken answers in a pool too small for both: the newer one, already playing, is
    preempted and waits to be prefilled again; then a new turn of `new_type` arrives.
    -> (runner, step index at which the new turn arrived)."""
    sched = Scheduler(
        BlockManager(10, BS), max_num_seqs=8, max_num_batched_tokens=16, max_prefill_tokens_while_decoding=CAP
    )
    runner = FakeRunner(sched)
    first = make_seq(0, list(range(1, 9)), max_new=20, output_type="both")
    playing = make_seq(1, list(range(11, 19)), max_new=20, output_type="both")
    sched.add(first)
    sched.add(playing)
    while sched.num_preemptions == 0:
        runner.step()
    assert list(sched.waiting) == [playing] and not playing.is_awaiting_first_audio
    sched.add(make_seq(NEW, list(range(100, 110)), max_new=4, output_type=new_type))
    arrival = len(runner.steps)
    runner.run()
    assert runner.generated[1] == expected_tokens(range(11, 19), 20)  # recomputed, same tokens
    assert runner.generated[NEW] == expected_tokens(range(100, 110), 4)
    assert_pool_idle(sched.block_manager)
    return runner, arrival


def test_new_turn_prefill_goes_ahead_of_a_playing_turns_second_prefill():
    runner, arrival = preempted_playing_turn_then_new_turn("both")
    new_steps = steps_with_prefill(runner, NEW, arrival)
    again = steps_with_prefill(runner, 1, arrival)
    # Admitted at once and prefilled, ahead of the preempted turn queued before it.
    assert new_steps[:2] == [arrival, arrival + 1] and again[0] > arrival + 1
    for i in set(new_steps) & set(again):  # (the new turn, preempted in turn, came back first too)
        assert prefill_order(runner, i).index(NEW) < prefill_order(runner, i).index(1)


def test_control_text_answer_waits_behind_the_playing_turn():
    runner, arrival = preempted_playing_turn_then_new_turn("text")
    new_steps = steps_with_prefill(runner, NEW, arrival)
    again = steps_with_prefill(runner, 1, arrival)
    assert again[0] <= new_steps[0] and prefill_order(runner, again[0])[0] == 1
