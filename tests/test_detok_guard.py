"""The real-time guard and the latency-first order (pure bookkeeping, no model)."""

from dataclasses import dataclass

import pytest

from kimiaudio.detok.realtime_guard import CostEstimate, GuardSettings, plan_chunks

SETTINGS = GuardSettings(
    max_batch_sessions=8, run_ahead_s=0.5, first_ode_steps=10, ode_steps=16, min_ode_steps=6, lower_first_chunk=False
)


@dataclass
class Stream:
    name: str
    playback_deadline: float
    is_playing: bool = True
    next_chunk_s: float = 1.0


def cost(seconds_per_call: float) -> CostEstimate:
    return CostEstimate(seconds_per_call)


def test_no_risk_no_lowering_most_urgent_first():
    due = [Stream("later", 10.4), Stream("dry", 9.95), Stream("soon", 10.1)]
    plan = plan_chunks(due, now=10.0, llm_busy=True, settings=SETTINGS, cost=cost(0.001))
    assert [s.name for s in plan.streams] == ["dry", "soon", "later"]
    assert plan.ode_steps == [None, None, None] and plan.num_lowered == 0


def test_a_first_chunk_goes_first_and_streams_with_slack_wait_for_the_next_batch():
    """A turn waiting for its first audio runs ahead of every later chunk or flush; while one
    does, a playing stream joins it only if it would run dry before the batch after this one
    lands (this batch at 10 + 16 DiT calls and the next at 16, 1 ms a call: 42 ms), whether the
    LM is busy or not; the longest-waiting first chunk first."""
    due = [
        Stream("later", 10.4),
        Stream("new", 9.0, is_playing=False),
        Stream("soon", 10.1),
        Stream("dry", 9.95),
        Stream("newer", 9.5, is_playing=False),
    ]
    for busy in (True, False):
        plan = plan_chunks(due, now=10.0, llm_busy=busy, settings=SETTINGS, cost=cost(0.001))
        assert [s.name for s in plan.streams] == ["new", "newer", "dry"]
    # At 10.07 "soon" has 30 ms of audio left: it joins; "later" still waits.
    plan = plan_chunks(due, now=10.07, llm_busy=True, settings=SETTINGS, cost=cost(0.001))
    assert [s.name for s in plan.streams] == ["new", "newer", "dry", "soon"]
    # The first chunks take the batch's room before any playing stream.
    limited = GuardSettings(**{**SETTINGS.__dict__, "max_batch_sessions": 2})
    plan = plan_chunks(due, now=10.0, llm_busy=True, settings=limited, cost=cost(0.001))
    assert [s.name for s in plan.streams] == ["new", "newer"]
    # Once no first chunk is due, every playing stream may run again (LM idle).
    playing = [s for s in due if s.is_playing]
    plan = plan_chunks(playing, now=10.0, llm_busy=False, settings=SETTINGS, cost=cost(0.001))
    assert [s.name for s in plan.streams] == ["dry", "soon", "later"]


def test_run_ahead_and_limit():
    due = [Stream(f"s{i}", 10.0 + 0.1 * i) for i in range(12)]
    busy = plan_chunks(due, now=10.0, llm_busy=True, settings=SETTINGS, cost=cost(0.0))
    assert [s.name for s in busy.streams] == ["s0", "s1", "s2", "s3", "s4", "s5"]  # <= 0.5 s left to play
    idle = plan_chunks(due, now=10.0, llm_busy=False, settings=SETTINGS, cost=cost(0.0))
    assert len(idle.streams) == 8  # max_batch_sessions, the soonest to run dry


def test_at_risk_batch_gets_the_most_steps_that_fit():
    # Forecast at normal steps: a group of 10 calls (first chunk) + 16 (later chunks), 10 ms each.
    # "tight" has 0.1 s left and its next chunk adds 0.3 s: 0.4 s of room < 2 x 0.26 s.
    due = [
        Stream("new", 9.5, is_playing=False),
        Stream("tight", 10.1, next_chunk_s=0.3),
        Stream("fine", 10.3, next_chunk_s=2.0),
    ]
    plan = plan_chunks(due, now=10.0, llm_busy=True, settings=SETTINGS, cost=cost(0.01))
    # With a first chunk due, "tight" and "fine" join it: each would run dry within the 0.42 s
    # this batch and the next take (10 + 16 DiT calls, then 16).
    assert [s.name for s in plan.streams] == ["new", "tight", "fine"]
    # later chunks at s steps: 2 x (10 + s) x 0.01 <= 0.4 fails for s >= 11, and s = 10 joins the
    # first chunk's group (one group of 10 calls): the batch's later chunks run at 10 steps
    assert plan.ode_steps == [None, 10, 10] and plan.num_lowered == 2
    later_only = [Stream("tight", 10.1, next_chunk_s=0.21), Stream("fine", 10.45, next_chunk_s=2.0)]
    plan = plan_chunks(later_only, now=10.0, llm_busy=True, settings=SETTINGS, cost=cost(0.01))
    assert plan.ode_steps == [15, 15]  # 0.31 s of room < 2 x 16 x 0.01; 2 x 15 x 0.01 fits


def test_floor_when_nothing_fits_and_first_chunks_kept():
    due = [Stream("new", 9.0, is_playing=False), Stream("dry", 9.9, next_chunk_s=0.1)]
    plan = plan_chunks(due, now=10.0, llm_busy=True, settings=SETTINGS, cost=cost(0.05))
    assert plan.ode_steps == [None, 6] and plan.num_lowered == 1
    allowed = GuardSettings(**{**SETTINGS.__dict__, "lower_first_chunk": True})
    plan = plan_chunks(due, now=10.0, llm_busy=True, settings=allowed, cost=cost(0.05))
    assert plan.ode_steps == [6, 6] and plan.num_lowered == 2


def test_official_settings_never_lower():
    official = GuardSettings(8, 0.5, first_ode_steps=30, ode_steps=30, min_ode_steps=30, lower_first_chunk=False)
    due = [Stream("dry", 9.0, next_chunk_s=0.1)]
    plan = plan_chunks(due, now=10.0, llm_busy=True, settings=official, cost=cost(1.0))
    assert plan.ode_steps == [None] and plan.num_lowered == 0


@pytest.mark.parametrize("limit", [1, 3])
def test_nobody_starves(limit):
    """Served streams move their deadline later by their chunk's audio; the others keep theirs,
    so each is served within every ceil(n / limit) + 2 rounds (a new reply, waiting since it was
    submitted, may cut in once)."""
    settings = GuardSettings(**{**SETTINGS.__dict__, "max_batch_sessions": limit})
    streams = [Stream(f"s{i}", 10.0 + 0.01 * i, next_chunk_s=0.2) for i in range(7)]
    waited = {s.name: 0 for s in streams}
    bound = -(-len(streams) // limit) + 2
    now = 10.0
    for round_ in range(80):
        if round_ % 10 == 5:  # a stream's reply ends and a new one is submitted now
            replaced = streams[round_ % len(streams)]
            replaced.is_playing, replaced.playback_deadline = False, now
        plan = plan_chunks(streams, now, llm_busy=False, settings=settings, cost=cost(0.001))
        for s in streams:
            waited[s.name] = 0 if s in plan.streams else waited[s.name] + 1
            assert waited[s.name] <= bound, (round_, s.name)
        for s in plan.streams:
            s.is_playing = True
            s.playback_deadline = max(s.playback_deadline, now) + s.next_chunk_s
        now += 0.05


def test_cost_estimate_moving_average():
    c = CostEstimate(weight=0.5)
    assert c.batch_seconds([10, 16]) == 0.0
    c.observe(2.6, 26)
    assert c.seconds_per_call == pytest.approx(0.1)
    c.observe(0.9, 30)
    assert c.seconds_per_call == pytest.approx(0.065)
    c.observe(1.0, 0)  # nothing ran: ignored
    assert c.batch_seconds([10, 16]) == pytest.approx(26 * 0.065)
