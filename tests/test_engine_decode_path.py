"""The static-shape decode path (decode_batch.py), run eagerly on the CPU: the code a CUDA graph
captures. Its buffers and padded rows, its attention against a float64 reference, and the
engine through it (padded as with graphs) token for token equal to the eager flat-batch path
and to the batch-1 reference loop, with chunked prefill, preemption, aborts and mixed lengths.
"""

from __future__ import annotations

import math

import pytest
import torch

from kimiaudio.config import EngineConfig
from kimiaudio.engine.decode_batch import CONTEXT, POSITION, SLOT, DecodeInputs, decode_batch_sizes
from kimiaudio.engine.kv_pool import KVPool
from kimiaudio.engine.llm_engine import LLMEngine
from kimiaudio.engine.mixed_batch import CONTINUOUS, MixedInputs, mixed_token_buckets
from kimiaudio.engine.sequence import Sequence
from kimiaudio.engine.step_plan import StepPlan

from helpers.engine_scenarios import build_requests, load_tiny_lm, reference_steps, run_scenario
from helpers.sequences import make_sequence

HQ, HKV, D, BS = 4, 2, 8, 4


def test_decode_batch_sizes():
    assert decode_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert decode_batch_sizes(1) == [1]
    assert decode_batch_sizes(5) == [1, 2, 4, 5]
    assert decode_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert decode_batch_sizes(100) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 100]


def decoding_seq(seq_id: int, length: int, table: list[int]) -> Sequence:
    """A sequence of `length` positions whose last one is this step's decode row."""
    seq = make_sequence(seq_id, range(10, 10 + length), block_size=BS, use_text=[seq_id % 2 == 0] * length)
    seq.block_table = table
    seq.num_computed_tokens = length - 1
    return seq


def decode_plan(seqs: list[Sequence]) -> StepPlan:
    plan = StepPlan()
    for seq in seqs:
        plan.add_decode(seq)
    return plan


def test_prepare_writes_rows_then_padding():
    pool = KVPool(1, 16, BS, HKV, D, "cpu", torch.float32)
    inputs = DecodeInputs(pool, 8, 40, torch.float32, use_kernel=False, batch_sizes=decode_batch_sizes(8))
    assert inputs.max_blocks == 10
    seqs = [decoding_seq(0, 6, [3, 9]), decoding_seq(1, 9, [1, 4, 12]), decoding_seq(2, 1, [0])]
    assert inputs.fits(decode_plan(seqs))
    padded, width = inputs.prepare(seqs)
    assert (padded, width) == (4, 3)
    batch = inputs.batch(padded, width)
    assert batch.audio_ids.tolist() == [15, 18, 10, 0]  # padded to 4 rows
    assert batch.text_ids.tolist() == [7, 7, 7, 0] and batch.use_text.tolist() == [1, 0, 1, 0]
    assert batch.positions.tolist() == [5, 8, 0, 0]
    scratch = pool.scratch_block * BS
    assert batch.slot_mapping.tolist() == [9 * BS + 1, 12 * BS + 0, 0, scratch]
    meta = batch.attention.meta
    assert meta.context_lens.tolist() == [6, 9, 1, 1]
    assert meta.block_tables.tolist() == [[3, 9, 16], [1, 4, 12], [0, 16, 16], [16, 16, 16]]
    assert meta.mask.shape == (4, 1, 1, 3 * BS)
    assert inputs.fields[POSITION, :4].tolist() == [5, 8, 0, 0]
    # Full width: the graph's view of the same buffers.
    assert inputs.prepare(seqs[:1]) == (1, 2)
    assert inputs.batch(1, inputs.max_blocks).attention.meta.block_tables.shape == (1, 10)
    assert inputs.fields[SLOT, 1].item() == scratch and inputs.fields[CONTEXT, 1].item() == 1
    # Not a decode step: a prefill chunk, a continuous position, more rows than the buffers hold.
    chunk = decoding_seq(2, 5, [2, 5])
    chunk.num_computed_tokens = 2
    mixed = decode_plan(seqs[:1])
    mixed.add_chunk(chunk, 3)
    assert not inputs.fits(mixed)
    feature = decoding_seq(3, 5, [2, 5])
    feature.continuous_mask[-1] = True
    assert not inputs.fits(decode_plan([feature]))
    assert not inputs.fits(decode_plan([decoding_seq(i, 3, [i]) for i in range(9)]))
    with pytest.raises(ValueError, match="expected 1..8"):
        inputs.padded_size(9)


def test_padded_decode_attention_matches_reference():
    gen = torch.Generator().manual_seed(0)
    pool = KVPool(2, 24, BS, HKV, D, "cpu", torch.float32)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=gen))
    inputs = DecodeInputs(pool, 8, 32, torch.float32, use_kernel=False, batch_sizes=decode_batch_sizes(8))
    free = torch.randperm(24, generator=gen).tolist()
    lengths = [1, 7, 13, 4, 16]  # padded to 8 rows
    seqs = [decoding_seq(i, n, [free.pop() for _ in range(-(-n // BS))]) for i, n in enumerate(lengths)]
    padded, _ = inputs.prepare(seqs)
    batch = inputs.batch(padded, inputs.max_blocks)
    q = torch.randn(8, HQ, D, generator=gen)
    k, v = torch.randn(8, HKV, D, generator=gen), torch.randn(8, HKV, D, generator=gen)
    for layer in range(2):
        out = batch.attention(layer, q, k, v)
        assert torch.isfinite(out).all()  # padded rows too
        for row, seq in enumerate(seqs):
            slots = [seq.block_table[p // BS] * BS + p % BS for p in range(lengths[row])]
            keys, values = pool.keys(layer)[slots].double(), pool.values(layer)[slots].double()
            assert torch.equal(pool.keys(layer)[slots[-1]], k[row])  # the new token was stored first
            for h in range(HQ):
                weights = torch.softmax(keys[:, h // (HQ // HKV)] @ q[row, h].double() / math.sqrt(D), dim=0)
                torch.testing.assert_close(
                    out[row, h].double(), weights @ values[:, h // (HQ // HKV)], atol=1e-6, rtol=1e-6
                )


@pytest.fixture(scope="module")
def scenario(golden_checkpoint, golden, golden_rules):
    """The golden requests (build_requests) and, per request, the reference loop's steps."""
    lm = load_tiny_lm(golden_checkpoint)
    arrivals = build_requests(lm, golden, golden_rules)
    return lm, arrivals, {req.request_id: reference_steps(lm, req) for _, req in arrivals}


# A pool of 12 blocks of 8 preempts, with one or two sequences decoding at a time (padded to
# 3); one of 40 runs up to seven at once (padded to 8 as with CUDA graphs).
@pytest.mark.parametrize("num_blocks, batch_sizes", [(12, [3, 8]), (40, decode_batch_sizes(8))])
def test_padded_static_path_equals_flat_path_and_reference(scenario, monkeypatch, num_blocks, batch_sizes):
    lm, arrivals, expected = scenario
    config = EngineConfig(block_size=8, num_kv_blocks=num_blocks, max_num_batched_tokens=24, max_num_seqs=8)

    static = LLMEngine(lm, config, "cpu", torch.float32)
    static.runner.decode_inputs.batch_sizes = batch_sizes
    padded_steps = []
    prepare = static.runner.decode_inputs.prepare

    def recording_prepare(seqs, previous=None):
        padded, width = prepare(seqs, previous)
        padded_steps.append((len(seqs), padded))
        return padded, width

    monkeypatch.setattr(static.runner.decode_inputs, "prepare", recording_prepare)
    outputs, finished = run_scenario(static, arrivals)
    assert (static.stats().num_preemptions > 0) == (num_blocks == 12)
    assert sum(rows < padded for rows, padded in padded_steps) > 10
    assert max(rows for rows, _ in padded_steps) >= (2 if num_blocks == 12 else 5)

    flat = LLMEngine(lm, config, "cpu", torch.float32)
    monkeypatch.setattr(flat.runner.decode_inputs, "fits", lambda plan: False)  # every step the flat batch
    assert run_scenario(flat, arrivals) == (outputs, finished)
    assert_reference_results(outputs, finished, expected)


def assert_reference_results(outputs: dict, finished: dict, expected: dict) -> None:
    for rid, (steps, reason) in expected.items():
        if rid == "abort-waiting":
            assert outputs[rid] == []
        elif rid == "abort-running":
            assert outputs[rid] == steps[:5]
        elif rid == "fixed-length":  # ignore_eos: past the reference's stop, to the length limit
            assert outputs[rid][: len(steps)] == steps and len(outputs[rid]) == 30
        else:
            assert (outputs[rid], finished[rid]) == (steps, reason), rid


def test_padded_mixed_path_equals_reference(scenario):
    """Every mixed step padded to its bucket (16 or 24 tokens) as with CUDA graphs, through the
    static buffers of mixed_batch.py (the torch reference of the runs on the CPU), decodes
    through the padded decode path; preemption included: token for token the reference loop's."""
    lm, arrivals, expected = scenario
    config = EngineConfig(block_size=8, num_kv_blocks=12, max_num_batched_tokens=24, max_num_seqs=8)
    engine = LLMEngine(lm, config, "cpu", torch.float32)
    runner = engine.runner
    runner.decode_inputs.batch_sizes = decode_batch_sizes(8)
    inputs = MixedInputs(
        runner.pool,
        8,
        mixed_token_buckets(24),
        config.max_model_len,
        lm.config.kimia_adaptor_input_dim,
        torch.float32,
        use_kernel=False,
    )
    steps = []
    prepare = inputs.prepare

    def recording_prepare(plan, previous=None):
        bucket, sampling = prepare(plan, previous)
        steps.append((plan.num_tokens, bucket, bool(inputs.fields[CONTINUOUS, : plan.num_tokens].any())))
        return bucket, sampling

    inputs.prepare = recording_prepare
    runner.mixed_inputs = inputs
    outputs, finished = run_scenario(engine, arrivals)
    assert engine.stats().num_preemptions > 0
    assert len(steps) > 5 and sum(tokens < bucket for tokens, bucket, _ in steps) >= 3  # some padded
    assert any(with_features for _, _, with_features in steps)
    assert {bucket for _, bucket, _ in steps} == {16, 24}
    assert_reference_results(outputs, finished, expected)
