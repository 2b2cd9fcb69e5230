"""The pipeline on the demo checkpoint: a stack for the tests, turns run to their end, a started
pipeline for a test's body, its stats once it has settled."""

from __future__ import annotations

import asyncio
import threading
from contextlib import asynccontextmanager

import numpy as np

from kimiaudio.config import load_config
from kimiaudio.pipeline.events import AudioChunk, TextDelta, TurnDone, UserEncoded
from kimiaudio.pipeline.model_stack import ModelStack
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.pipeline.turn_request import TurnRequest


def load_demo_stack(checkpoint, block_size: int = 8, realtime_guard: bool = False) -> ModelStack:
    """The demo checkpoint's stack on the CPU with a small KV pool (256 blocks), as the
    pipeline tests use it; each test module loads its own (tests change its config).

    The real-time guard is off unless asked for (its floor at the full step count): on a
    loaded machine it lowers ODE steps, and then a turn's audio no longer equals the offline
    reference's. The detokenizer reads the floor when it is built, so it is set here, before
    the stack is loaded, not on the loaded stack's config."""
    overrides = {
        "model": {"path": str(checkpoint), "device": "cpu"},
        "engine": {"num_kv_blocks": 256, "block_size": block_size},
    }
    if not realtime_guard:
        overrides["detok"] = {"min_ode_steps": load_config(None, overrides).detok.ode_steps}
    stack = ModelStack.load(load_config(None, overrides))
    guard = stack.detokenizer.guard_settings
    assert realtime_guard or guard.min_ode_steps == guard.ode_steps  # the floor reached the detokenizer
    return stack


def voices(speech_16k: np.ndarray, n: int) -> list[np.ndarray]:
    """n different utterances cut from real speech (different lengths and gains)."""
    return [np.ascontiguousarray(speech_16k[: len(speech_16k) - 1600 * i] * (0.6 + 0.1 * i)) for i in range(n)]


async def run_turn(pipeline: Pipeline, request: TurnRequest) -> dict:
    events = [event async for event in pipeline.submit(request)]
    done = events[-1]
    assert isinstance(done, TurnDone) and sum(isinstance(e, TurnDone) for e in events) == 1
    # The positions the text came from, streamed with it: a prefix of the turn's text stream
    # (which a failed turn does not report).
    streamed = [t for e in events if isinstance(e, TextDelta) for t in e.text_tokens]
    if done.status != "failed":
        assert streamed == list(done.text_tokens[: len(streamed)]), "the deltas' text tokens"
    pcm = [e.pcm for e in events if isinstance(e, AudioChunk)]
    return {
        "events": events,
        "done": done,
        "text": "".join(e.text for e in events if isinstance(e, TextDelta)),
        "pcm": np.concatenate(pcm) if pcm else np.zeros(0, np.float32),
        "codes": next((e.audio_tokens for e in events if isinstance(e, UserEncoded)), None),
    }


def with_pipeline(stack, body, config=None):
    """Run `await body(pipeline)` on a started pipeline; stop it afterwards."""

    async def main():
        pipeline = Pipeline(stack, config or stack.config)
        await pipeline.start()
        try:
            return await body(pipeline)
        finally:
            await pipeline.stop()

    return asyncio.run(main())


@asynccontextmanager
async def lm_worker_held(pipeline: Pipeline):
    """The LM worker waits, between two iterations, until the block ends: turns submitted in it
    reach the worker together, as a burst committed at once (the loop thread posting them would
    otherwise race the worker taking the first)."""
    gate = threading.Event()
    held = pipeline._lm.call(gate.wait)  # noqa: SLF001 - a test's hold on the worker's loop
    try:
        yield
        await asyncio.sleep(0)  # tasks made in the block take their first step: they submit
    finally:
        gate.set()
    await asyncio.wrap_future(held)


async def settled_stats(pipeline: Pipeline, timeout: float = 120.0) -> dict:
    """The pipeline's stats once no turn is left on its workers: a turn's TurnDone can reach
    the loop a moment before the other worker has dropped its state (KV blocks are freed by
    the LM worker at its next iteration). The limit catches a hang: a loaded machine is slow."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        stats = pipeline.stats()
        idle = stats["turns"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"]
        if idle or asyncio.get_running_loop().time() > deadline:
            return stats
        await asyncio.sleep(0.01)
