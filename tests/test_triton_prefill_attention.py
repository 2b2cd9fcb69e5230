"""The paged prefill attention kernel (engine/triton_prefill_attention.py) against a float64
reference over each sequence's keys gathered from the pool.

Runs compiled on a GPU, in Triton's interpreter on CPU tensors without one (tests/conftest.py
sets TRITON_INTERPRET=1 before the kernels are imported), at tails: runs of 1, 3 and 17 query
rows, cached prefixes that end inside a block, several sequences of different lengths in one
batch, padded rows, and the grouped-query ratios of the checkpoints' configs (the golden
tiny one and the full-size shape; in the interpreter the full size's group in fewer, smaller
heads, so that a case takes seconds).
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers.sequences import make_sequence

pytest.importorskip("triton")

from kimiaudio.engine.kv_pool import KVPool  # noqa: E402
from kimiaudio.engine.mixed_batch import MixedInputs  # noqa: E402
from kimiaudio.engine.paged_attention import AttentionMetadata, PagedAttention  # noqa: E402
from kimiaudio.engine.step_plan import StepPlan  # noqa: E402
from kimiaudio.engine.triton_prefill_attention import paged_prefill_attention_triton, tile_sizes  # noqa: E402
from kimiaudio.models.kimia_config import KimiaConfig  # noqa: E402
from kimiaudio.random_weights.lm import lm_config  # noqa: E402
from kimiaudio.random_weights.shapes import FULL  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def heads_of(config: KimiaConfig) -> tuple[int, int, int]:
    """(head_dim, query heads, kv heads): the config's on a GPU; in the interpreter its group
    in at most two kv heads of at most 32 dimensions."""
    group = config.num_attention_heads // config.num_key_value_heads
    if DEVICE.type == "cuda":
        return config.head_dim, config.num_attention_heads, config.num_key_value_heads
    kv_heads = min(2, config.num_key_value_heads)
    return min(32, config.head_dim), group * kv_heads, kv_heads


@pytest.fixture(scope="module", params=["golden", "full"])
def heads(request, golden_checkpoint):
    if request.param == "golden":
        return heads_of(KimiaConfig.from_file(golden_checkpoint / "config.json"))
    return heads_of(KimiaConfig.from_dict(lm_config(FULL)))


def reference(q, pool_k, pool_v, table, context, block_size):
    """q [n, Hq, D] of the last n positions of a sequence of `context` keys -> [n, Hq, D] (float64)."""
    slots = [table[p // block_size] * block_size + p % block_size for p in range(context)]
    keys, values = pool_k.flatten(0, 1)[slots].double(), pool_v.flatten(0, 1)[slots].double()
    group = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    out = torch.empty(q.shape, dtype=torch.float64)
    for i in range(q.shape[0]):
        seen = context - q.shape[0] + i + 1
        scores = torch.einsum("hd,khd->hk", q[i].double(), keys[:seen]) / math.sqrt(q.shape[-1])
        out[i] = torch.einsum("hk,khd->hd", scores.softmax(-1), values[:seen])
    return out


def run_case(heads, dtype, block_size, runs, pad_rows=0, seed=0):
    """runs: (cached prefix, query rows) per sequence, in batch order. -> (out, expected rows)."""
    head_dim, num_heads, num_kv_heads = heads
    gen = torch.Generator().manual_seed(seed)
    contexts = [prefix + rows for prefix, rows in runs]
    num_blocks = sum(-(-c // block_size) for c in contexts) + 2
    pool = KVPool(1, num_blocks, block_size, num_kv_heads, head_dim, DEVICE, dtype)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=gen).to(dtype))
    order = torch.randperm(num_blocks, generator=gen).tolist()  # scattered, non-monotonic blocks
    tables = [[order.pop() for _ in range(-(-c // block_size))] for c in contexts]
    width = max(map(len, tables)) + 1  # a column no sequence uses, as a graph's fixed width has
    block_tables = torch.tensor([t + [pool.scratch_block] * (width - len(t)) for t in tables], dtype=torch.int32)
    starts = [0]
    for _, rows in runs:
        starts.append(starts[-1] + rows)
    q = torch.randn(starts[-1] + pad_rows, num_heads, head_dim, generator=gen).to(dtype)
    out = paged_prefill_attention_triton(
        q.to(DEVICE),
        pool.kv[0, 0],
        pool.kv[1, 0],
        block_tables.to(DEVICE),
        torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        torch.tensor(contexts, dtype=torch.int32, device=DEVICE),
    ).cpu()
    assert out.shape == q.shape and out.dtype == dtype
    for (prefix, rows), start, table in zip(runs, starts, tables):
        expected = reference(
            q[start : start + rows], pool.kv[0, 0].cpu(), pool.kv[1, 0].cpu(), table, prefix + rows, block_size
        )
        torch.testing.assert_close(out[start : start + rows].double(), expected, **TOL[dtype])
    return out, starts[-1]


@pytest.mark.parametrize("block_size", [4, 16])
def test_chunks_of_1_3_17_over_prefixes_inside_a_block(heads, block_size):
    # Fresh prompts, prefixes ending mid-block and on a block edge, a decode row (1 of 14).
    runs = [(0, 17), (5, 3), (13, 1), (0, 1), (2 * block_size, 17), (block_size + 3, 3)]
    run_case(heads, torch.float32, block_size, runs)


def test_bfloat16_and_many_short_runs(heads):
    # More sequences than a tile's tokens, most of them decodes: the tile search across runs.
    runs = [(7 * i % 11, 1 + (i % 3 == 0) * 2) for i in range(9)]
    run_case(heads, torch.bfloat16, 8, runs, seed=1)


def test_padded_rows_and_an_empty_sequence():
    """The static batch's padding (mixed_batch.py): a last sequence of no key owns the padded
    rows, which come out zero, as rows outside every run do; rows of the others are unaffected."""
    heads = heads_of(KimiaConfig.from_dict(lm_config(FULL)))
    out, used = run_case(heads, torch.float32, 4, [(6, 3), (0, 5), (0, 0)], pad_rows=3)
    assert used == 8 and torch.equal(out[8:], torch.zeros_like(out[8:]))  # rows outside every run
    # Append the padding as a sequence of 4 rows and no key: zeros, never NaN.
    head_dim, num_heads, num_kv_heads = heads
    pool = KVPool(1, 4, 4, num_kv_heads, head_dim, DEVICE, torch.float32)
    pool.kv.normal_()
    q = torch.randn(6, num_heads, head_dim, device=DEVICE)
    starts = torch.tensor([0, 2, 6], dtype=torch.int32, device=DEVICE)
    tables = torch.tensor([[0, 1], [pool.scratch_block] * 2], dtype=torch.int32, device=DEVICE)
    got = paged_prefill_attention_triton(
        q, pool.kv[0, 0], pool.kv[1, 0], tables, starts, torch.tensor([7, 0], dtype=torch.int32, device=DEVICE)
    )
    assert torch.equal(got[2:], torch.zeros_like(got[2:]))
    expected = reference(q[:2].cpu(), pool.kv[0, 0].cpu(), pool.kv[1, 0].cpu(), [0, 1], 7, 4)
    torch.testing.assert_close(got[:2].cpu().double(), expected, **TOL[torch.float32])


def test_tiles_hold_whole_query_head_groups():
    for group in (1, 2, 7, 8, 20):
        for interpreted in (True, False):
            block_m, block_q, tile_n = tile_sizes(group, 128, 2, interpreted)
            assert block_q >= 1 and block_q * group <= block_m and block_m & (block_m - 1) == 0
            assert block_m >= 16 and tile_n >= 16  # tl.dot's smallest tile
    assert tile_sizes(7, 128, 2, False)[2] == 64 and tile_sizes(7, 128, 4, False)[2] == 32


def test_mixed_steps_through_the_kernel_equal_the_torch_path(heads):
    """PagedAttention over steps that mix decodes with prefill chunks (with and without a
    cached prefix): the kernel path (one call over every row) against the torch path (decode
    attention + one masked sdpa per chunk), each over its own copy of the pool."""
    head_dim, num_heads, num_kv_heads = heads
    block_size, lengths = 4, [14, 6, 22]
    gen = torch.Generator().manual_seed(3)
    pools = [KVPool(2, 16, block_size, num_kv_heads, head_dim, DEVICE, torch.float32) for _ in range(2)]
    free = torch.randperm(16, generator=gen).tolist()
    tables = [[free.pop() for _ in range(-(-n // block_size))] for n in lengths]
    done = [0, 0, 0]
    for step in ([5, 1, 8], [1, 2, 3], [7, 1, 1], [0, 1, 9], [1, 0, 1]):  # positions per sequence
        entries = [(tables[s], done[s], n) for s, n in enumerate(step) if n]
        rows = sum(step)
        q = torch.randn(rows, num_heads, head_dim, generator=gen).to(DEVICE)
        k, v = (torch.randn(rows, num_kv_heads, head_dim, generator=gen).to(DEVICE) for _ in range(2))
        outs = []
        for pool, use_kernel in zip(pools, (False, True)):
            meta = AttentionMetadata.build(entries, block_size, DEVICE, torch.float32, use_kernel)
            assert (meta.runs is not None) == use_kernel
            outs.append(PagedAttention(pool, meta)(1, q, k, v))
        torch.testing.assert_close(outs[1], outs[0], **TOL[torch.float32])
        done = [d + n for d, n in zip(done, step)]
    assert torch.equal(pools[0].kv, pools[1].kv)  # the same K/V stored


def test_static_mixed_batch_through_the_kernel_equals_the_torch_path(heads):
    """A mixed step padded to its bucket in the static buffers of mixed_batch.py (empty sequence
    slots, the padding's run with no key, full-width tables): the kernel against the torch
    reference of the runs, rows and stored K/V alike."""
    head_dim, num_heads, num_kv_heads = heads
    block_size = 4
    gen = torch.Generator().manual_seed(5)
    decode = make_sequence(0, range(10, 16), block_size=block_size)
    decode.block_table, decode.num_computed_tokens = [3, 9], 5
    chunk = make_sequence(1, range(20, 27), block_size=block_size)
    chunk.block_table, chunk.num_computed_tokens = [1, 4], 2
    fresh = make_sequence(2, range(30, 33), block_size=block_size)
    fresh.block_table = [7]
    plan = StepPlan()
    plan.add_decode(decode)
    plan.add_chunk(chunk, 4)
    plan.add_chunk(fresh, 3)
    q = torch.randn(16, num_heads, head_dim, generator=gen).to(DEVICE)
    k, v = (torch.randn(16, num_kv_heads, head_dim, generator=gen).to(DEVICE) for _ in range(2))
    outs, pools = [], []
    for use_kernel in (False, True):
        pool = KVPool(1, 12, block_size, num_kv_heads, head_dim, DEVICE, torch.float32)
        pool.kv.copy_(torch.randn(pool.kv.shape, generator=torch.Generator().manual_seed(9)))
        inputs = MixedInputs(pool, 4, [16], 40, 2, torch.float32, use_kernel)
        batch = inputs.batch(inputs.prepare(plan)[0])
        outs.append(batch.attention(0, q, k, v))
        pools.append(pool)
    torch.testing.assert_close(outs[1], outs[0], **TOL[torch.float32])
    assert torch.equal(outs[1][8:], torch.zeros_like(outs[1][8:]))  # the padding's rows
    # The usable blocks alike; the scratch block (the last) takes every padding row's K/V, and
    # on CUDA which of those writes lands last is the hardware's choice on either path.
    usable = slice(0, pools[0].scratch_block)
    assert torch.equal(pools[0].kv[:, :, usable], pools[1].kv[:, :, usable])
