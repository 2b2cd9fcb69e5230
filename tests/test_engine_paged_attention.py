"""Paged attention equals plain causal attention over each sequence's contiguous history.

Several sequences with scattered block tables are fed in steps that mix prefill chunks
(with and without a cached prefix) and single-token decodes in one packed batch; every
output row is compared with an independent float64 softmax(q k^T / sqrt(D)) v.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kimiaudio.config import EngineConfig
from kimiaudio.engine.kv_pool import KVPool, max_useful_blocks, pool_num_blocks
from kimiaudio.engine.paged_attention import AttentionMetadata, PagedAttention

HQ, HKV, D, BS, LAYERS = 4, 2, 8, 4, 2


def reference_attention(q, k, v, start):
    """q [n, Hq, D] at positions start..start+n-1; k/v [start+n, Hkv, D]; float64 loops."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.empty_like(q)
    group = HQ // HKV
    for i in range(q.shape[0]):
        for h in range(HQ):
            keys, vals = k[: start + i + 1, h // group], v[: start + i + 1, h // group]
            weights = torch.softmax(keys @ q[i, h] / math.sqrt(D), dim=0)
            out[i, h] = weights @ vals
    return out


def test_paged_matches_contiguous_causal_attention():
    gen = torch.Generator().manual_seed(0)
    pool = KVPool(LAYERS, 32, BS, HKV, D, "cpu", torch.float32)
    free = torch.randperm(32, generator=gen).tolist()  # scattered, non-monotonic blocks
    lengths = [14, 6, 22]
    tables = [[free.pop() for _ in range(-(-n // BS))] for n in lengths]
    keys = [[torch.randn(n, HKV, D, generator=gen) for _ in range(LAYERS)] for n in lengths]
    values = [[torch.randn(n, HKV, D, generator=gen) for _ in range(LAYERS)] for n in lengths]
    queries = [[torch.randn(n, HQ, D, generator=gen) for _ in range(LAYERS)] for n in lengths]
    # Per step: how many positions each sequence computes (0 = not in this batch).
    # Decode rows first (a slice), after a prefill (gathered rows), and an all-decode step.
    plan = [[5, 1, 8], [1, 2, 3], [7, 1, 1], [0, 1, 9], [0, 1, 0], [1, 0, 1]]
    done = [0, 0, 0]
    for step in plan:
        entries, spans = [], []
        for s, count in enumerate(step):
            if count:
                entries.append((tables[s], done[s], count))
                spans.append((s, done[s], count))
        meta = AttentionMetadata.build(entries, BS, torch.device("cpu"))
        attn = PagedAttention(pool, meta)
        for layer in range(LAYERS):
            q = torch.cat([queries[s][layer][a : a + n] for s, a, n in spans])
            k = torch.cat([keys[s][layer][a : a + n] for s, a, n in spans])
            v = torch.cat([values[s][layer][a : a + n] for s, a, n in spans])
            out = attn(layer, q, k, v)
            row = 0
            for s, a, n in spans:
                expected = reference_attention(
                    queries[s][layer][a : a + n], keys[s][layer][: a + n], values[s][layer][: a + n], a
                )
                torch.testing.assert_close(out[row : row + n].double(), expected, atol=1e-5, rtol=1e-5)
                row += n
        for s, _, n in spans:
            done[s] += n
    assert done == lengths
    # The pool holds every sequence's keys at the slots its block table names.
    for s, n in enumerate(lengths):
        for layer in range(LAYERS):
            slots = [tables[s][p // BS] * BS + p % BS for p in range(n)]
            torch.testing.assert_close(pool.keys(layer)[slots], keys[s][layer])
            torch.testing.assert_close(pool.values(layer)[slots], values[s][layer])


def test_pool_size_from_config():
    """engine.num_kv_blocks when set; else the memory plan's blocks, never more than
    max_num_seqs sequences of max_model_len positions use; an engine alone, that many."""
    per_block = KVPool.bytes_per_block(6, 16, 2, 16, torch.float32)
    assert per_block == 2 * 6 * 16 * 2 * 16 * 4
    config = EngineConfig(block_size=16, max_num_seqs=4, max_model_len=100)  # 7 blocks a sequence
    assert max_useful_blocks(config) == 28
    assert pool_num_blocks(dataclasses.replace(config, num_kv_blocks=12), 5) == 12
    assert pool_num_blocks(config, 20) == 20 and pool_num_blocks(config, 100) == 28  # capped by use
    assert pool_num_blocks(config, None) == 28 and pool_num_blocks(config, -3) == 0


def test_cpu_pool_starts_zeroed_in_any_dtype():
    # Lazily zeroed through calloc on the CPU (see KVPool); bfloat16 goes through bytes.
    for dtype in (torch.float32, torch.bfloat16):
        pool = KVPool(LAYERS, 64, BS, HKV, D, "cpu", dtype)
        # 64 blocks for the block manager, then the scratch block of padded decode rows.
        assert pool.kv.dtype == dtype and pool.kv.shape == (2, LAYERS, 65, BS, HKV, D)
        assert pool.scratch_block == 64 and pool.scratch_slot == 64 * BS
        assert not pool.kv.any()
        pool.keys(1)[5] = 1.0  # slot views write through to the pool
        assert pool.kv[0, 1, 1, 1].eq(1).all() and int(pool.kv.ne(0).sum()) == HKV * D
