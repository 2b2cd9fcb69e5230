"""The detokenizer worker's order (pipeline/detok_worker.py, detok/realtime_guard.py): a turn's
first chunk runs ahead of the flush of an answer already playing, each batch runs one chunk per
stream, and the order changes nothing in the audio. Events are read in order, never timed."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from kimiaudio.checkpoint.paths import find_checkpoint
from kimiaudio.config import load_config
from kimiaudio.detok.detokenizer import Detokenizer
from kimiaudio.pipeline.detok_worker import DetokWorker
from kimiaudio.pipeline.events import TurnDone
from kimiaudio.pipeline.metrics import PipelineMetrics
from kimiaudio.pipeline.turn_handle import TurnHandle
from kimiaudio.pipeline.worker_messages import EndTurn, OpenStream, PushCodes


@pytest.fixture(scope="module")
def config(demo_checkpoint):
    # The guard's floor at the full step count: the audio is compared with the offline path's.
    overrides = {"model": {"path": str(demo_checkpoint), "device": "cpu"}, "detok": {"min_ode_steps": 16}}
    return load_config(None, overrides)


@pytest.fixture(scope="module")
def detokenizer(config):
    paths = find_checkpoint(config.resolve(config.model.path))
    return Detokenizer.load(paths, "cpu", torch.float32, config.detok)


def test_a_first_chunk_runs_ahead_of_a_playing_answer_s_flush(config, detokenizer, monkeypatch):
    codes = [int(c) for c in np.random.default_rng(5).integers(0, 64, 40)]
    expected = detokenizer.detokenize(codes, seed=7).numpy()
    batches: list[list[tuple[str, bool]]] = []  # per step_batch call: (turn id, its stream final)
    pcm: dict[str, list[np.ndarray]] = {"flush": [], "new": []}
    names: dict[int, str] = {}
    real = detokenizer.step_batch

    def step_batch(items, **options):
        wavs = real(items, **options)
        batches.append([(names[id(item.stream)], item.final) for item in items])
        for item, wav in zip(items, wavs):
            pcm[names[id(item.stream)]].append(wav.numpy())
        return wavs

    def new_stream(seed=None, **options):  # each turn's stream, known by its seed
        stream = real_new_stream(seed=seed, **options)
        names[id(stream)] = {7: "flush", 8: "new"}[seed]
        return stream

    real_new_stream = detokenizer.new_stream
    monkeypatch.setattr(detokenizer, "step_batch", step_batch)
    monkeypatch.setattr(detokenizer, "new_stream", new_stream)
    metrics = PipelineMetrics()
    worker = DetokWorker(detokenizer, config, torch.device("cpu"), metrics, lambda: False, lambda turn_id: None)
    loop = asyncio.new_event_loop()  # the handles' loop: events queue on it, never read here
    try:
        flush, new = TurnHandle("flush", loop), TurnHandle("new", loop)
        worker.handle(OpenStream(flush, 7, None))
        worker.handle(PushCodes([("flush", c) for c in codes]))
        worker.iterate()  # its first chunk (8 codes of 40): it is playing now
        assert batches == [[("flush", False)]]
        # Its listener has far more audio queued than a batch takes: it has slack.
        flush.submitted_at += 1000.0
        worker.handle(EndTurn("flush", TurnDone("completed")))  # the LM is done: the rest is a flush
        worker.handle(OpenStream(new, 8, None))
        worker.handle(PushCodes([("new", c) for c in codes[:8]]))  # its first chunk is due
        while worker.iterate() == 0:
            pass
    finally:
        loop.close()
    # The new turn's first chunk ran alone, before any chunk of the flush; then the flush, one
    # chunk per batch (the rest of its 32 codes: at least two chunks), the last one final.
    assert batches[1] == [("new", False)]
    later = batches[2:]
    assert len(later) >= 2 and all(batch == [("flush", True)] for batch in later), batches
    assert worker.num_turns == 1 and metrics.beside()[:2] == (len(batches), len(batches))  # the flush ended
    # Batched one chunk at a time or all at once, the audio is the offline detokenizer's.
    np.testing.assert_allclose(np.concatenate(pcm["flush"]), expected, atol=1e-4, rtol=1e-4)
