"""Overlapped decode steps (engine/launched_step.py): the next step is launched from the
previous one's samples on the device before the host reads them.

The order of events is recorded around the runner and the launched steps (no clock): each
decode step of a steady batch is launched before the previous one is read, a request waiting
for a slot does not stop that, a new request's prefill chunk is launched too; a plan a launch
cannot run (host-side sampling) runs once the step in flight is read. The results equal the batch-1 reference loop token
for token with overlap on and off, a sequence that stops inside a chain gives no output past
its end, and the prefix cache never keys a position whose ids were still on the device.
"""

from __future__ import annotations

from kimiaudio.engine.launched_step import LaunchedStep
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.engine.sequence import UNRESOLVED

from helpers.engine_scenarios import (
    build_requests,
    engine_for,
    golden_prompt,
    make_request,
    reference_steps,
    run_scenario,
)


class Recorder:
    """Events in order: ("launch", step, previous), ("read", step), ("run", plan size),
    ("schedule",); steps by the order they were launched in (0, 1, ...)."""

    def __init__(self, engine, monkeypatch):
        self.events: list[tuple] = []
        self.steps: list[LaunchedStep] = []  # in launch order (kept alive: numbered by identity)
        self.rows: list[list[int]] = []  # per launched step, its sequences' ids
        runner, scheduler = engine.runner, engine.scheduler
        launch, run, schedule, read = runner.launch, runner.run, scheduler.schedule, LaunchedStep.read

        def recording_launch(plan, previous):
            step = launch(plan, previous)
            self.steps.append(step)
            self.rows.append([seq.seq_id for seq in plan.seqs])
            self.events.append(("launch", self.number(step), self.number(previous)))
            return step

        def recording_run(plan):
            self.events.append(("run", len(plan)))
            return run(plan)

        def recording_schedule():
            self.events.append(("schedule",))
            return schedule()

        def recording_read(step):
            if any(s is step for s in self.steps):  # this engine's (the patch is on the class)
                self.events.append(("read", self.number(step)))
            return read(step)

        monkeypatch.setattr(runner, "launch", recording_launch)
        monkeypatch.setattr(runner, "run", recording_run)
        monkeypatch.setattr(scheduler, "schedule", recording_schedule)
        monkeypatch.setattr(LaunchedStep, "read", recording_read)

    def number(self, step) -> int | None:
        return None if step is None else next(i for i, s in enumerate(self.steps) if s is step)

    def of(self, kind: str) -> list[tuple]:
        return [e for e in self.events if e[0] == kind]


def drain(engine, arrivals=(), on_output=None) -> dict:
    """Step until idle; requests (step, request) join at their step. -> outputs per request id."""
    arrivals, outputs, step = list(arrivals), {}, 0
    while arrivals or engine.has_work():
        for item in [a for a in arrivals if a[0] <= step]:
            engine.add_request(item[1])
            arrivals.remove(item)
        for out in engine.step():
            assert out.error is None
            outputs.setdefault(out.request_id, []).append(out)
            if on_output is not None:
                on_output(out)
        step += 1
    stats = engine.stats()
    assert stats.num_blocks_free == stats.num_blocks_total  # nothing leaked
    return outputs


def tokens(outs) -> list[tuple[int, int]]:
    return [(o.text_token, o.audio_token) for o in outs]


def request(tiny_engine_setup, rid, section="lm.both", output_type="both", params=None):
    lm, tensors, rules = tiny_engine_setup
    params = params or SamplingParams(seed=7, max_new_tokens=16, ignore_eos=True)  # the defaults, sampled
    return make_request(rid, golden_prompt(tensors, section), params, output_type, rules)


def recorded_run(tiny_engine_setup, monkeypatch, arrivals, max_num_seqs=8) -> Recorder:
    """Requests (step, request) through an engine with blocks for all, until idle; each one's
    tokens are the reference loop's. -> the events."""
    lm = tiny_engine_setup[0]
    engine = engine_for(lm, num_blocks=40, max_num_seqs=max_num_seqs)
    events = Recorder(engine, monkeypatch)
    outputs = drain(engine, arrivals)
    for _, req in arrivals:
        assert tokens(outputs[req.request_id]) == reference_steps(lm, req)[0]
    return events


def test_each_decode_step_is_launched_before_the_previous_one_is_read(tiny_engine_setup, monkeypatch):
    events = recorded_run(
        tiny_engine_setup,
        monkeypatch,
        [(0, request(tiny_engine_setup, "a")), (0, request(tiny_engine_setup, "b", "lm_e2e"))],
    )
    chained = [e for e in events.of("launch") if e[2] is not None]
    assert len(chained) >= 10
    order = events.events
    for _, step, previous in chained:
        launched_at = order.index(("launch", step, previous))
        assert order[launched_at + 1] == ("read", previous)  # read right after the next launch
        assert order.index(("read", previous)) > order.index(next(e for e in order if e[:2] == ("launch", previous)))
    reads = [e[1] for e in events.of("read")]
    assert sorted(reads) == list(range(len(events.steps)))  # every launched step read once


def test_overlap_on_and_off_equal_the_reference(tiny_engine_setup, monkeypatch):
    """The engine scenario (chunked prefill, preemption, aborts, penalties, features) gives the
    same tokens with overlap on and off, and the reference loop's."""
    lm, tensors, rules = tiny_engine_setup
    arrivals = build_requests(lm, tensors, rules)
    off = engine_for(lm, overlap_steps=False)
    off_events = Recorder(off, monkeypatch)
    results = run_scenario(off, arrivals)
    assert not off_events.of("launch")
    on = engine_for(lm)
    on_events = Recorder(on, monkeypatch)
    assert run_scenario(on, arrivals) == results
    assert len([e for e in on_events.of("launch") if e[2] is not None]) >= 3
    outputs, finished = results
    for _, req in arrivals:
        if not req.request_id.startswith("abort") and req.request_id != "fixed-length":
            assert (outputs[req.request_id], finished[req.request_id]) == reference_steps(lm, req), req.request_id


def test_a_sequence_stopping_inside_a_chain_ends_there_and_keys_no_unresolved_position(tiny_engine_setup, monkeypatch):
    lm = tiny_engine_setup[0]
    engine = engine_for(lm, num_blocks=40, block_size=4)
    events = Recorder(engine, monkeypatch)
    stops = request(tiny_engine_setup, "stops", "lm.text", "text", SamplingParams.greedy(max_new_tokens=40))
    expected, reason = reference_steps(lm, stops)
    assert reason == "stop" and len(expected) < 40  # the golden text answer ends on its own
    long = request(
        tiny_engine_setup, "long", params=SamplingParams(seed=3, max_new_tokens=len(expected) + 12, ignore_eos=True)
    )
    ended = []
    outputs = drain(engine, [(0, stops), (0, long)], lambda out: out.finished and ended.append(out.request_id))
    assert tokens(outputs["stops"]) == expected and outputs["stops"][-1].finish_reason == "stop"
    assert tokens(outputs["long"]) == reference_steps(lm, long)[0]
    assert ended == ["stops", "long"]
    # Its last row ran in a step launched from the one whose samples ended it: no output came of it.
    stops_seq = 0  # the first request added
    containing = [i for i, ids in enumerate(events.rows) if stops_seq in ids]
    assert ("launch", containing[-1], containing[-1] - 1) in events.events and containing[-1] - 1 in containing
    keys = [key for key in engine.block_manager.keys if key is not None]
    assert keys and all(UNRESOLVED not in position[:2] for key in keys for position in key)


def test_a_new_requests_prefill_is_launched_beside_the_decodes(tiny_engine_setup, monkeypatch):
    events = recorded_run(
        tiny_engine_setup,
        monkeypatch,
        [(0, request(tiny_engine_setup, "first")), (6, request(tiny_engine_setup, "late", "lm_e2e"))],
    )
    # Planned while a step was in flight, the prefill chunk and the decode beside it are
    # launched from that step's samples, and it is read after.
    late_seq = 1  # the second request added
    k = next(i for i, rows in enumerate(events.rows) if late_seq in rows)
    launched_at = events.events.index(("launch", k, k - 1))
    assert events.events[launched_at + 1] == ("read", k - 1) and events.rows[k] == [0, 1]


def test_a_request_waiting_for_a_slot_does_not_stop_the_chain(tiny_engine_setup, monkeypatch):
    arrivals = [(0, request(tiny_engine_setup, "first")), (0, request(tiny_engine_setup, "second", "lm_e2e"))]
    events = recorded_run(tiny_engine_setup, monkeypatch, arrivals, max_num_seqs=1)  # one runs, one waits
    runs_alone = [e for e in events.of("launch") if e[2] is not None]
    assert len(runs_alone) >= 2 * 10  # each request's decode steps chained, the other waiting or done
    assert {seq for rows in events.rows for seq in rows} == {0, 1} and all(len(rows) == 1 for rows in events.rows)


def test_an_abort_drops_the_launched_rows_output(tiny_engine_setup, monkeypatch):
    lm = tiny_engine_setup[0]
    engine = engine_for(lm, num_blocks=40)
    events = Recorder(engine, monkeypatch)
    keep, drop = request(tiny_engine_setup, "keep"), request(tiny_engine_setup, "drop", "lm_e2e")
    seq_ids, outs = {}, []

    def record(out):
        outs.append(out)
        if out.request_id == "drop" and sum(o.request_id == "drop" for o in outs) == 3:
            assert engine.abort(seq_ids["drop"])  # its next row is launched already

    for req in (keep, drop):
        seq_ids[req.request_id] = engine.add_request(req)
    outputs = drain(engine, on_output=record)
    assert len(outputs["drop"]) == 3 and not outputs["drop"][-1].finished
    assert tokens(outputs["drop"]) == reference_steps(lm, drop)[0][:3]
    assert tokens(outputs["keep"]) == reference_steps(lm, keep)[0]
    assert any(seq_ids["drop"] in ids for ids in events.rows[1:])


def test_host_sampled_settings_never_launch(tiny_engine_setup, monkeypatch):
    params = SamplingParams(seed=4, max_new_tokens=10, audio_repetition_penalty=1.2)
    events = recorded_run(tiny_engine_setup, monkeypatch, [(0, request(tiny_engine_setup, "penalised", params=params))])
    assert not events.of("launch") and len(events.of("run")) >= 10


def test_a_plan_the_launched_step_cannot_run_beside_reads_it_first(tiny_engine_setup, monkeypatch):
    """Should the plan made while a step is in flight not be one a launch runs (here: the one
    that still holds a sequence whose last sample is in flight is refused), the
    engine reads that step, drops the sequences that ended in it from the plan, and runs the
    rest at once: the same tokens."""
    lm = tiny_engine_setup[0]
    engine = engine_for(lm, num_blocks=40)
    events = Recorder(engine, monkeypatch)
    stops = request(tiny_engine_setup, "stops", "lm.text", "text", SamplingParams.greedy(max_new_tokens=40))
    expected, _ = reference_steps(lm, stops)
    other = request(
        tiny_engine_setup, "other", params=SamplingParams(seed=3, max_new_tokens=len(expected) + 6, ignore_eos=True)
    )
    can_launch = engine.runner.can_launch

    def refusing_the_stopping_one(plan):
        ending = any(seq.request_id == "stops" and seq.rules.num_steps == len(expected) - 1 for seq in plan.seqs)
        return can_launch(plan) and not ending

    monkeypatch.setattr(engine.runner, "can_launch", refusing_the_stopping_one)
    outputs = drain(engine, [(0, stops), (0, other)])
    assert tokens(outputs["stops"]) == expected
    assert tokens(outputs["other"]) == reference_steps(lm, other)[0]
    # The chain broke where `stops` ended: the step in flight read, then `other` alone run.
    order = events.events
    alone = order.index(("run", 1), order.index(("launch", 0, None)))
    k = order[alone - 4][1]
    assert order[alone - 4 : alone] == [("launch", k, k - 1), ("read", k - 1), ("schedule",), ("read", k)]
    stops_seq = 0  # the first request added
    assert stops_seq in events.rows[k]
