"""Speech encoding in stages on the LM worker (pipeline/speech_encoding.py, audio/staged_work.py):
the staged encoders equal the one-call ones, a batch advances by a budget of time, and a turn
committed while another answer runs is encoded between that answer's engine steps."""

from __future__ import annotations

import asyncio
import math
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

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


def counting_stages(n: int, clock: FakeClock | None = None, seconds: float = 0.0, closed: list | None = None):
    try:
        for _ in range(n):
            if clock is not None:
                clock.now += seconds
            yield
        return "result"
    finally:
        if closed is not None:
            closed.append(True)


def test_a_job_runs_one_stage_on_a_zero_budget_and_all_on_an_unbounded_one():
    job = EncodeJob([b"k"], counting_stages(3))
    assert [job.advance(0.0) for _ in range(3)] == [None, None, None]
    assert job.advance(0.0) == "result"
    assert EncodeJob([b"k"], counting_stages(3)).advance(math.inf) == "result"


def test_a_job_runs_the_stages_that_fit_its_budget():
    clock = FakeClock()
    job = EncodeJob([b"k"], counting_stages(7, clock, seconds=0.010), clock=clock)
    runs = []
    while (result := job.advance(0.035)) is None:
        runs.append(round(clock.now, 3))
    # 10 ms stages in 35 ms: three per call (a fourth would overrun), the last call the rest.
    assert runs == [0.03, 0.06] and result == "result" and abs(job.seconds - 0.07) < 1e-9


def test_a_batch_no_pending_turn_wants_any_more_is_dropped():
    closed: list = []
    stack_like = SimpleNamespace(encode_speech_stages=lambda pcms: counting_stages(5, closed=closed))
    encoding = SpeechEncoding(stack_like, batch_size=4, metrics=PipelineMetrics())
    turn = LmTurn(None, None, {b"u": np.zeros(16000, np.float32)}, 0.0)
    assert encoding.advance([turn], busy=True, budget_s=0.0) == [] and encoding.has_job
    assert encoding.advance([], busy=True, budget_s=0.0) == []  # the turn was cancelled meanwhile
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
            staged = done.value
            break
    # A pause before every layer of both encoders and after each log-mel (sizes from the checkpoint).
    layers = len(stack.whisper.encoder.layers) + len(stack.glm4.model.layers)
    assert count >= layers + 2
    for (codes, features), pcm in zip(staged, pcms):
        one_codes, one_features = stack.encode_speech_batch([pcm])[0]
        assert codes == one_codes and torch.equal(features, one_features)
    assert run_to_end(counting_stages(2)) == "result"


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
