"""Speech encoding in stages on the LM worker (pipeline/speech_encoding.py, audio/staged_work.py):
the staged encoders equal the one-call ones, a batch advances by a budget of time, and a turn
committed while another answer runs is encoded between that answer's engine steps."""

from __future__ import annotations

import asyncio
import copy
import math
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from kimiaudio.audio.device_result import DeviceResult, HostCopy
from kimiaudio.audio.staged_work import run_to_end
from kimiaudio.engine.llm_engine import LLMEngine
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.pipeline.lm_turn import LmTurn
from kimiaudio.pipeline.lm_worker import LmWorker
from kimiaudio.pipeline.metrics import PipelineMetrics
from kimiaudio.pipeline.speech_encoding import EncodeJob, SpeechEncoding
from kimiaudio.pipeline.turn_request import TurnRequest

from helpers.pipeline_turns import load_demo_stack, run_turn, voices, with_pipeline


@pytest.fixture(scope="module")
def stack(demo_checkpoint):
    return load_demo_stack(demo_checkpoint)


class FakeClock:
    """Time that moves only when a stage runs: the budget tests do not depend on the machine."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def counting_stages(
    n: int, clock: FakeClock | None = None, seconds: float = 0.0, closed: list | None = None, value="result"
):
    try:
        for _ in range(n):
            if clock is not None:
                clock.now += seconds
            yield
        return DeviceResult([], lambda host: value)
    finally:
        if closed is not None:
            closed.append(True)


def test_a_job_runs_one_stage_on_a_zero_budget_and_all_on_an_unbounded_one():
    job = EncodeJob([b"k"], counting_stages(3))
    assert [job.advance(0.0) for _ in range(3)] == [False, False, False] and not job.launched
    assert job.advance(0.0) and job.ready() and job.results() == "result"
    job = EncodeJob([b"k"], counting_stages(3))
    assert job.advance(math.inf) and job.num_stages == 4 and job.results() == "result"


def test_a_job_runs_the_stages_that_fit_its_budget():
    clock = FakeClock()
    job = EncodeJob([b"k"], counting_stages(7, clock, seconds=0.010), clock=clock)
    runs = []
    while not job.advance(0.035):
        runs.append(round(clock.now, 3))
    # 10 ms stages in 35 ms: three per call (a fourth would overrun), the last call the rest.
    assert runs == [0.03, 0.06] and job.results() == "result" and abs(job.seconds - 0.07) < 1e-9


def test_a_batch_no_pending_turn_wants_any_more_is_dropped():
    closed: list = []
    stack_like = SimpleNamespace(encode_speech_stages=lambda pcms: counting_stages(5, closed=closed))
    encoding = SpeechEncoding(stack_like, batch_size=4, metrics=PipelineMetrics())
    turn = LmTurn(None, None, {b"u": np.zeros(16000, np.float32)}, 0.0)
    assert encoding.advance([turn], budget_s=0.0) == [] and encoding.has_job
    assert encoding.advance([], budget_s=0.0) == []  # the turn was cancelled meanwhile
    assert not encoding.has_job and closed == [True] and turn.encoded == {}


def test_staged_encoding_equals_the_one_call_encoders(stack, speech_16k):
    pcms = voices(speech_16k, 3)
    stages = stack.encode_speech_stages(pcms)
    count = 0
    while True:
        try:
            next(stages)
            count += 1
        except StopIteration as done:
            staged = HostCopy(done.value).value()
            break
    # A pause before every layer of both encoders and after each log-mel (sizes from the checkpoint).
    layers = len(stack.whisper.encoder.layers) + len(stack.glm4.model.layers)
    assert count >= layers + 2
    for (codes, features), pcm in zip(staged, pcms):
        one_codes, one_features = stack.encode_speech_batch([pcm])[0]
        assert codes == one_codes and torch.equal(features, one_features)
    assert run_to_end(counting_stages(2)).finish([]) == "result"


def test_a_turn_committed_during_an_answer_is_encoded_between_its_steps(stack, speech_16k, monkeypatch):
    """The first turn, with nothing generating, is encoded in one go; the second, committed
    while the first answer runs, a slice of stages per engine step, as long as a step took.
    The LM worker's clock is a fake one that only the steps and the stages move (10 ms a step,
    4 ms a stage): two stages fit a step's budget (a third would overrun it), whatever the
    machine's load, so the order of steps and stages is exact."""
    step_s, stage_s = 0.010, 0.004
    clock = FakeClock()
    log: list[tuple[str, int]] = []
    lock = threading.Lock()
    real_step, real_stages = LLMEngine.step, stack.encode_speech_stages
    jobs = iter(range(100))

    def step(self):
        out = real_step(self)
        with lock:
            clock.now += step_s
            log.append(("step", -1))
        return out

    def stages(pcms):
        job = next(jobs)
        inner = real_stages(pcms)
        while True:
            try:
                next(inner)
            except StopIteration as done:
                return done.value
            with lock:
                clock.now += stage_s
                log.append(("stage", job))
            yield

    monkeypatch.setattr(LmWorker, "clock", staticmethod(clock))
    monkeypatch.setattr(LLMEngine, "step", step)
    monkeypatch.setattr(stack, "encode_speech_stages", stages)
    first, second = voices(speech_16k, 2)
    params = SamplingParams(seed=1, max_new_tokens=200, ignore_eos=True)

    async def body(pipeline):
        answer = asyncio.create_task(run_turn(pipeline, TurnRequest("a", [], first, params)))
        while not any(kind == "step" for kind, _ in log):  # the first answer is being generated
            await asyncio.sleep(0.001)
        later = await run_turn(pipeline, TurnRequest("b", [], second, SamplingParams(seed=2, max_new_tokens=4)))
        return await answer, later

    answer, later = with_pipeline(stack, body)
    assert answer["done"].status == later["done"].status == "completed"

    def between(job: int) -> list[str]:
        at = [i for i, (kind, j) in enumerate(log) if kind == "stage" and j == job]
        return [kind for kind, _ in log[at[0] : at[-1] + 1]]

    assert "step" not in between(0)  # idle: one batch, all its stages at once
    slices = [0]  # stages of the second turn's batch run between one engine step and the next
    for kind in between(1):
        if kind == "step":
            slices.append(0)
        else:
            slices[-1] += 1
    # Every worker iteration: two stages (a step's budget), then one step; the last slice the rest.
    assert len(slices) >= 3 and slices[:-1] == [2] * (len(slices) - 1) and slices[-1] in (1, 2), slices


def test_batches_in_flight_on_the_device_are_released_in_order_as_each_lands(monkeypatch):
    """The CUDA path's bookkeeping, on the CPU: a launched batch's results land when its event
    is reached (here: when the test says). At most two batches are in flight; each is released
    to its turns as it lands, oldest first (one stream finishes its work in order), and a
    release returns at once so its turns start before any more encoder work is launched."""
    copies = []

    class LandsLater:  # HostCopy whose copies land when the test says, as a CUDA event not yet reached
        def __init__(self, result):
            self.result, self.landed = result, False
            copies.append(self)

        def ready(self):
            return self.landed

        def value(self):
            return self.result.finish([])

    monkeypatch.setattr(EncodeJob, "host_copy", LandsLater)
    batches: list[int] = []

    def stages(pcms):
        batches.append(len(pcms))
        yield
        yield
        return DeviceResult([], lambda host: [([len(p)], torch.zeros(1, 4)) for p in pcms])

    metrics = PipelineMetrics()
    encoding = SpeechEncoding(SimpleNamespace(encode_speech_stages=stages), batch_size=2, metrics=metrics)
    turns = [LmTurn(None, None, {bytes([i]): np.zeros(100 + i, np.float32)}, 0.0) for i in range(5)]

    def advance() -> list[int]:
        """One LM worker iteration's encoding, nothing generating; the turns fully encoded."""
        assert encoding.advance(turns, math.inf) == []
        return [i for i, turn in enumerate(turns) if not turn.missing]

    assert advance() == [] and batches == [2] and encoding.num_stages == 3  # launched whole
    assert advance() == [] and batches == [2, 2]  # the next one launched while the first runs
    assert advance() == [] and batches == [2, 2] and encoding.num_stages == 0  # two in flight: wait
    assert encoding.on_device
    copies[0].landed = True
    assert advance() == [0, 1] and encoding.num_stages == 0  # released; nothing launched after it
    assert turns[1].encoded[bytes([1])][0] == [101]
    assert advance() == [0, 1] and batches == [2, 2, 1]  # now the last batch
    copies[1].landed = copies[2].landed = True
    assert advance() == [0, 1, 2, 3, 4] and not encoding.has_job
    assert metrics.encode_batch_s.count == 3 and metrics.max_batch["encode"] == 2


def test_a_burst_s_first_batch_reaches_prefill_before_its_last_batch_is_encoded(stack, speech_16k, monkeypatch):
    """Five turns committed at once, at most two utterances a batch: each batch's turns start
    as soon as it is encoded, so the first batch's turns produce their first tokens (their
    prefill is done) before the last batch has been encoded. The order of events only."""
    log: list[tuple] = []
    lock = threading.Lock()
    real_step, real_stages = LLMEngine.step, stack.encode_speech_stages

    def step(self):
        outputs = real_step(self)
        with lock:
            log.extend(("output", out.request_id) for out in outputs)
        return outputs

    def stages(pcms):
        result = yield from real_stages(pcms)
        with lock:
            log.append(("encoded", tuple(len(p) for p in pcms)))
        return result

    monkeypatch.setattr(LLMEngine, "step", step)
    monkeypatch.setattr(stack, "encode_speech_stages", stages)
    config = copy.deepcopy(stack.config)
    config.audio.encode_batch_size = 2
    inputs = voices(speech_16k, 5)
    params = SamplingParams(seed=1, max_new_tokens=8, ignore_eos=True)

    async def body(pipeline):
        handles = [pipeline.submit(TurnRequest("c", [], pcm, params)) for pcm in inputs]
        results = [[event async for event in handle] for handle in handles]
        return {handle.turn_id: len(pcm) for handle, pcm in zip(handles, inputs)}, results

    lengths, results = with_pipeline(stack, body, config)
    assert all(events[-1].status == "completed" for events in results)
    batches = [(i, sizes) for i, (kind, sizes) in enumerate(log) if kind == "encoded"]
    assert len(batches) >= 3 and all(len(sizes) <= 2 for _, sizes in batches)
    assert sorted(n for _, sizes in batches for n in sizes) == sorted(lengths.values())
    (_, first), (last_at, _) = batches[0], batches[-1]
    once_started = {}
    for i, (kind, value) in enumerate(log):
        if kind == "output":
            once_started.setdefault(lengths[value], i)
    assert all(once_started[n] < last_at for n in first), (first, log)
