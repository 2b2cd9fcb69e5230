"""The static-shape mixed step (engine/mixed_batch.py) on the CPU: what a CUDA graph of a token
bucket captures. Its buckets, the buffers a step writes (rows, runs, logits rows, features,
padding) and its attention (the torch reference of the runs) against a float64 softmax; the
engine through it is test_engine_decode_path.py's, the kernel over it test_triton_prefill_attention.py's.
"""

from __future__ import annotations

import math

import pytest
import torch

from kimiaudio.engine.kv_pool import KVPool
from kimiaudio.engine.mixed_batch import AUDIO, CONTINUOUS, POSITION, SLOT, MixedInputs, mixed_token_buckets
from kimiaudio.engine.step_plan import StepPlan

from helpers.sequences import make_sequence

HQ, HKV, D, BS, FEATURE_DIM = 4, 2, 8, 4, 3


def test_mixed_token_buckets():
    assert mixed_token_buckets(320) == [16, 32, 64, 128, 192, 256, 320]
    assert mixed_token_buckets(20) == [16, 20]
    assert mixed_token_buckets(16) == [16]
    assert mixed_token_buckets(8) == [8]
    assert mixed_token_buckets(1000)[-3:] == [896, 960, 1000]


def three_sequence_plan() -> tuple[StepPlan, torch.Tensor]:
    """A decode (6 positions), a chunk of 4 over a prefix of 2 that ends inside a block and
    carries two feature rows (its prompt goes on), and a fresh prompt of 4 in one chunk:
    9 tokens, padded to the bucket of 16. -> (plan, the chunk's features)."""
    decode = make_sequence(0, range(10, 16), block_size=BS)
    decode.block_table, decode.num_computed_tokens = [3, 9], 5
    features = torch.arange(2 * FEATURE_DIM, dtype=torch.float32).view(2, FEATURE_DIM) + 1
    digests = [None] * 4 + ["f0", "f1", None]
    chunk = make_sequence(1, range(20, 27), block_size=BS, digests=digests, features=features)
    chunk.block_table, chunk.num_computed_tokens = [1, 4], 2
    fresh = make_sequence(2, range(30, 34), block_size=BS, use_text=[False] * 4)
    fresh.block_table = [7]
    plan = StepPlan()
    plan.add_decode(decode)
    plan.add_chunk(chunk, 4)
    plan.add_chunk(fresh, 4)
    return plan, features


def mixed_inputs(pool: KVPool) -> MixedInputs:
    return MixedInputs(pool, 4, [8, 16], 40, FEATURE_DIM, torch.float32, use_kernel=False)


def test_prepare_writes_rows_runs_logits_rows_and_padding():
    pool = KVPool(1, 16, BS, HKV, D, "cpu", torch.float32)
    inputs = mixed_inputs(pool)
    plan, features = three_sequence_plan()
    assert inputs.fits(plan)
    bucket, sampling = inputs.prepare(plan)
    assert bucket == 16 and sampling == [plan.seqs[0], plan.seqs[2]]
    batch = inputs.batch(16)
    scratch = pool.scratch_slot
    assert batch.audio_ids.tolist() == [15, 22, 23, 24, 25, 30, 31, 32, 33] + [0] * 7
    assert batch.positions.tolist() == [5, 2, 3, 4, 5, 0, 1, 2, 3] + [0] * 7
    assert batch.use_text.tolist() == [1] * 5 + [0] * 11
    assert batch.continuous.tolist() == [0, 0, 0, 1, 1] + [0] * 11
    slots = [9 * BS + 1, 1 * BS + 2, 1 * BS + 3, 4 * BS + 0, 4 * BS + 1, 7 * BS, 7 * BS + 1, 7 * BS + 2, 7 * BS + 3]
    assert batch.attention.meta.slot_mapping.tolist() == slots + [scratch] * 7
    assert torch.equal(batch.features[3:5], features)  # at the chunk's continuous rows
    runs = batch.attention.meta.runs
    # Three runs, an empty slot, then the padding's run of rows 9..15 with no key.
    assert runs.query_starts.tolist() == [0, 1, 5, 9, 9, 16]
    assert runs.context_lens.tolist() == [6, 6, 4, 0, 0]
    assert runs.block_tables.shape == (5, 10) and runs.block_tables[:3, :2].tolist() == [[3, 9], [1, 4], [7, 7]]
    assert batch.logits_rows.tolist() == [0, 8, 0, 0]  # the decode's and the fresh prompt's last rows
    # A smaller step into the same buffers: earlier rows past it are padding again.
    small = StepPlan()
    small.add_decode(plan.seqs[0])
    assert inputs.prepare(small) == (8, [plan.seqs[0]])
    assert inputs.fields[AUDIO, :3].tolist() == [15, 0, 0] and inputs.fields[SLOT, 1:9].eq(scratch).all()
    assert inputs.fields[POSITION, 1:].eq(0).all() and inputs.fields[CONTINUOUS].eq(0).all()
    assert inputs.query_starts.tolist() == [0, 1, 1, 1, 1, 8] and inputs.context_lens.tolist() == [6, 0, 0, 0, 0]
    # Too many tokens or sequences for the buffers: the eager flat batch takes the step.
    big = StepPlan()
    big.add_chunk(make_sequence(5, range(40, 57), block_size=BS), 17)
    assert not inputs.fits(big)
    with pytest.raises(ValueError, match="expected 1..16"):
        inputs.bucket(17)


def test_padded_runs_attention_matches_reference():
    gen = torch.Generator().manual_seed(0)
    pool = KVPool(2, 16, BS, HKV, D, "cpu", torch.float32)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=gen))
    inputs = mixed_inputs(pool)
    plan, _ = three_sequence_plan()
    batch = inputs.batch(inputs.prepare(plan)[0])
    q = torch.randn(16, HQ, D, generator=gen)
    k, v = torch.randn(16, HKV, D, generator=gen), torch.randn(16, HKV, D, generator=gen)
    for layer in range(2):
        out = batch.attention(layer, q, k, v)
        assert torch.equal(out[9:], torch.zeros_like(out[9:]))  # padding rows: no key, zeros
        row = 0
        for seq, count in plan:
            context = seq.num_computed_tokens + count
            slots = [seq.block_table[p // BS] * BS + p % BS for p in range(context)]
            keys, values = pool.keys(layer)[slots].double(), pool.values(layer)[slots].double()
            assert torch.equal(pool.keys(layer)[slots[-count:]], k[row : row + count])  # stored first
            for i in range(count):
                seen = context - count + i + 1
                for h in range(HQ):
                    kv_head = h // (HQ // HKV)
                    scores = keys[:seen, kv_head] @ q[row + i, h].double() / math.sqrt(D)
                    expected = torch.softmax(scores, 0) @ values[:seen, kv_head]
                    torch.testing.assert_close(out[row + i, h].double(), expected, atol=1e-6, rtol=1e-6)
            row += count
