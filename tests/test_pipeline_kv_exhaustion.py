"""KV exhaustion: a pool far too small for the turns asked of it at once (engine.num_kv_blocks
tiny) queues them or preempts them by recompute, never crashes: every turn ends completed with
all its tokens, preemptions happened, and the pool is whole at the end. A pool smaller than
one sequence of engine.max_model_len is the most one sequence holds: an answer ends there, a
prompt longer is refused as too long; the others go on."""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest

from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.pipeline.turn_request import TurnRequest

from helpers.pipeline_turns import load_demo_stack, run_turn, settled_stats, voices, with_pipeline

BLOCK_SIZE = 8
NEW_TOKENS = 48
TURNS = 6


@pytest.fixture(scope="module")
def stack(demo_checkpoint):
    return load_demo_stack(demo_checkpoint, BLOCK_SIZE)


def tiny_pool_config(stack, num_blocks: int):
    config = copy.deepcopy(stack.config)
    config.engine.num_kv_blocks = num_blocks
    return config


def test_a_tiny_pool_queues_and_preempts_and_every_turn_ends(stack, speech_16k):
    inputs = voices(speech_16k, TURNS)
    params = [SamplingParams(seed=i, max_new_tokens=NEW_TOKENS, ignore_eos=True) for i in range(TURNS)]

    async def alone(pipeline):
        return [await run_turn(pipeline, TurnRequest("c", [], x, p)) for x, p in zip(inputs, params)]

    reference = with_pipeline(stack, alone)
    longest = max(len(r["codes"]) for r in reference)
    # About two turns' worth of blocks for six turns at once: the longest turn fits alone.
    num_blocks = 2 * ((longest + 40 + NEW_TOKENS) // BLOCK_SIZE + 2)

    async def crowded(pipeline):
        results = await asyncio.wait_for(
            asyncio.gather(*[run_turn(pipeline, TurnRequest("c", [], x, p)) for x, p in zip(inputs, params)]), 300
        )
        return results, await settled_stats(pipeline)

    results, stats = with_pipeline(stack, crowded, tiny_pool_config(stack, num_blocks))
    assert stats["kv_blocks_total"] == num_blocks
    assert [r["done"].status for r in results] == ["completed"] * TURNS, [r["done"] for r in results]
    assert stats["preemptions"] > 0, stats  # the pool really ran out
    assert stats["kv_blocks_free"] == num_blocks and stats["turns"] == 0 and stats["running"] == 0
    for got, alone_result in zip(results, reference):
        assert len(got["done"].audio_tokens) > 0
        # Preemption recomputes: the same seed gives the same tokens as the turn had alone.
        assert got["done"].text_tokens == alone_result["done"].text_tokens
        assert got["done"].audio_tokens == alone_result["done"].audio_tokens


def test_turns_are_held_to_a_pool_smaller_than_one_sequence(stack, speech_16k):
    """engine.num_kv_blocks below one sequence of engine.max_model_len: an answer asking for
    more than the pool holds ends at the pool's length (finish_reason length, as one reaching
    max_model_len does), a prompt longer than the pool is the client's error
    (context_length_exceeded), and the turns beside them are served."""
    num_blocks = 40
    positions = num_blocks * BLOCK_SIZE
    inputs = voices(speech_16k, 2)
    params = SamplingParams(seed=1, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    too_many = SamplingParams(seed=1, max_new_tokens=4000, ignore_eos=True)
    too_long = np.tile(speech_16k, int(2 * positions / 12.5 * 16000 / len(speech_16k)) + 1)  # 12.5 codes a second

    async def body(pipeline):
        results = await asyncio.wait_for(
            asyncio.gather(
                run_turn(pipeline, TurnRequest("c", [], inputs[0], params)),
                run_turn(pipeline, TurnRequest("c", [], inputs[1], too_many)),
                run_turn(pipeline, TurnRequest("c", [], too_long, params)),
            ),
            300,
        )
        return results, await settled_stats(pipeline)

    results, stats = with_pipeline(stack, body, tiny_pool_config(stack, num_blocks))
    assert stack.config.engine.max_model_len > positions
    done = [r["done"] for r in results]
    assert [d.status for d in done] == ["completed", "completed", "failed"], done
    assert done[1].finish_reason == "length"
    prompt_positions = done[1].prefill_tokens_computed + done[1].prefill_tokens_cached
    assert prompt_positions + len(done[1].text_tokens) - 1 == positions  # every position of the pool
    assert done[2].error_code == "context_length_exceeded" and "KV pool" in done[2].error
    assert stats["kv_blocks_free"] == num_blocks and stats["turns"] == 0
