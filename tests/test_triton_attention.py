"""The Triton kernels of the paged KV pool against their torch references (paged_attention.py).

On a GPU they run as compiled; without one, in Triton's interpreter on CPU tensors (this
module sets TRITON_INTERPRET=1 when no GPU is present, before the kernels are imported), at
smaller shapes. Skipped where triton is not installed (the test extras install its wheel on
Linux x86_64; CI fails if these skip: KIMIAUDIO_REQUIRE_TRITON=1, tests/conftest.py).
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from kimiaudio.engine import triton_attention  # noqa: E402
from kimiaudio.engine.decode_attention import DecodeMetadata, decode_attention  # noqa: E402
from kimiaudio.engine.kv_pool import KVPool, store_kv  # noqa: E402
from kimiaudio.engine.triton_attention import decode_partitions  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}


def random_pool(layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    pool = KVPool(layers, num_blocks, block_size, num_kv_heads, head_dim, DEVICE, dtype)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=gen).to(dtype))
    return pool, gen


def test_partitions_split_only_small_batches():
    assert decode_partitions(64, 4, 8192, 32, 264) == (8192, 1)  # 256 programs: no split
    size, parts = decode_partitions(1, 4, 8192, 32, 264)  # 4 programs: split in 66 at most
    assert size % 32 == 0 and parts * size >= 8192 and (parts - 1) * size < 8192 and parts <= 66
    assert decode_partitions(1, 4, 64, 32, 264) == (32, 2)  # never below one tile
    assert decode_partitions(3, 2, 1000, 64, 264)[1] <= 44


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_matches_index_copy(dtype):
    pool, gen = random_pool(2, 9, 4, 2, 16, dtype)
    expected = pool.kv.clone()
    qkv = torch.randn(5, 4 + 2 + 2, 16, generator=gen).to(dtype).to(DEVICE)  # q, k, v heads of one GEMM
    k, v = qkv[:, 4:6], qkv[:, 6:8]  # strided views, as the model hands them over
    slots = torch.tensor([3, 17, 36, 0, 22], device=DEVICE)
    for kv, src in ((0, k), (1, v)):
        expected[kv, 1].flatten(0, 1)[slots] = src
    store_kv(pool, 1, slots, k, v, use_kernel=True)
    assert torch.equal(pool.kv, expected)


# The 7B's heads (28 query heads over 4 K/V heads of 128: GQA group 7) on a GPU; in the
# interpreter, which runs every program in Python, the same group of 7 in fewer, smaller heads.
SEVEN_B = (128, 28, 4) if DEVICE.type == "cuda" else (32, 14, 2)
CASES = [  # (dtype, head_dim, Hq, Hkv, block_size, context lengths: 1 = a padded row's)
    (torch.float32, 16, 4, 2, 8, [1, 7, 8, 9, 40, 1]),
    (torch.float32, 32, 4, 4, 4, [5, 33, 1]),
    (torch.float32, *SEVEN_B, 16, [70, 1, 3]),
    (torch.bfloat16, *SEVEN_B, 16, [70, 129, 1]),
    (torch.bfloat16, 64, 8, 1, 16, [200]),
    (torch.float16, 32, 6, 2, 8, [17, 2]),
    (torch.float32, 16, 4, 2, 4, [(7 * i) % 23 + 1 for i in range(40)]),  # 80 programs: unsplit
]


@pytest.mark.parametrize("dtype, head_dim, num_heads, num_kv_heads, block_size, lengths", CASES)
@pytest.mark.parametrize("width", ["tight", "wide"])
def test_decode_attention_matches_torch_gather(dtype, head_dim, num_heads, num_kv_heads, block_size, lengths, width):
    num_blocks = sum(-(-n // block_size) for n in lengths) + 3
    pool, gen = random_pool(2, num_blocks, block_size, num_kv_heads, head_dim, dtype, seed=len(lengths))
    order = torch.randperm(num_blocks, generator=gen).tolist()  # scattered blocks
    tables = [[order.pop() for _ in range(-(-n // block_size))] for n in lengths]
    # A wide table (a graph's fixed width) has more columns than any row uses; its extra
    # entries name the scratch block, as the static buffers' padding does.
    columns = max(map(len, tables)) + (5 if width == "wide" else 0)
    rows = [t + [pool.scratch_block] * (columns - len(t)) for t in tables]
    block_tables = torch.tensor(rows, dtype=torch.int32, device=DEVICE)
    context_lens = torch.tensor(lengths, device=DEVICE)
    q = torch.randn(len(lengths), num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    if len(lengths) == 40:
        assert decode_partitions(40, num_kv_heads, 100, 64, 64)[1] == 1
    for layer in range(2):
        torch_meta = DecodeMetadata.create(block_tables, context_lens, block_size, dtype, use_kernel=False)
        kernel_meta = DecodeMetadata.create(block_tables, context_lens, block_size, dtype, use_kernel=True)
        expected = decode_attention(pool, layer, q, torch_meta)
        got = decode_attention(pool, layer, q, kernel_meta)
        assert got.dtype == dtype and got.shape == q.shape
        torch.testing.assert_close(got.float(), expected.float(), **TOL[dtype])


def test_partitions_merge_in_the_launch_and_leave_the_semaphores_zeroed(monkeypatch):
    # One sequence of 7B-like GQA heads split in many partitions, against the same attention
    # unsplit: the last partition to finish merges the others in the same launch.
    head_dim, num_heads, num_kv_heads, block_size = SEVEN_B[0], SEVEN_B[1], SEVEN_B[2], 16
    pool, gen = random_pool(1, 12, block_size, num_kv_heads, head_dim, torch.float32, seed=5)
    tables = torch.tensor([list(range(10)), [10, 11] + [pool.scratch_block] * 8], dtype=torch.int32, device=DEVICE)
    lengths = torch.tensor([150, 20], device=DEVICE)
    q = torch.randn(2, num_heads, head_dim, generator=gen).to(DEVICE)
    meta = DecodeMetadata.create(tables, lengths, block_size, torch.float32, use_kernel=True)
    outputs = []
    for target in (64, 1):  # split (the second row uses only the first partition); whole
        monkeypatch.setattr(triton_attention, "_target_programs", lambda device, target=target: target)
        outputs.append(decode_attention(pool, 0, q, meta))
    assert decode_partitions(2, num_kv_heads, 160, 32 if head_dim >= 128 else 64, 64)[1] >= 3
    torch.testing.assert_close(outputs[0], outputs[1], **TOL[torch.float32])
    assert pool.semaphores(1).numel() >= 2 * num_kv_heads and not pool.semaphores(1).any()


@pytest.mark.slow
def test_engine_through_the_kernels_equals_reference(monkeypatch, golden_checkpoint, golden, golden_rules):
    # The golden scenario of test_engine_decode_path with the kernels in every step (padded
    # static decodes and flat mixed steps): token for token the reference loop's. On a GPU every
    # kernel and five requests in full; in the interpreter (every program of every kernel run in
    # Python: seconds a step) the paged pool's kernels, storing K/V and decode attention (the
    # layers' kernels are test_triton_layers.py's), and four requests of 7 tokens at most.
    from kimiaudio.config import EngineConfig
    from kimiaudio.engine.decode_batch import decode_batch_sizes
    from kimiaudio.engine.llm_engine import LLMEngine
    from kimiaudio.layers.triton_support import kernel_mode

    from helpers.engine_scenarios import build_requests, load_tiny_lm, reference_steps, run_scenario

    lm = load_tiny_lm(golden_checkpoint, DEVICE)
    tensors, rules = golden, golden_rules
    on_gpu = DEVICE.type == "cuda"
    keep = (
        ("both", "trunc", "sampled", "penalised", "abort-running")
        if on_gpu
        else ("both", "trunc", "sampled", "abort-running")
    )
    arrivals = [
        (
            step,
            req
            if on_gpu
            else replace(req, params=replace(req.params, max_new_tokens=min(7, req.params.max_new_tokens))),
        )
        for step, req in build_requests(lm, tensors, rules)
        if req.request_id in keep
    ]
    expected = {req.request_id: reference_steps(lm, req) for _, req in arrivals}
    monkeypatch.setenv("KIMIAUDIO_KERNELS", "triton")
    kernel_mode.cache_clear()
    try:
        engine = LLMEngine(
            lm,
            EngineConfig(block_size=8, num_kv_blocks=40, max_num_batched_tokens=24, max_num_seqs=8, cuda_graphs=False),
            DEVICE,
            torch.float32,
        )
        assert engine.runner.use_kernels and engine.runner.graphs is None
        engine.runner.decode_inputs.batch_sizes = decode_batch_sizes(8)
        if not on_gpu:  # the engine keeps its pool's kernels; the layers go back to torch
            monkeypatch.setenv("KIMIAUDIO_KERNELS", "auto")
            kernel_mode.cache_clear()
        outputs, finished = run_scenario(engine, arrivals)
    finally:
        monkeypatch.delenv("KIMIAUDIO_KERNELS")
        kernel_mode.cache_clear()
    for rid, (steps, reason) in expected.items():
        if rid == "abort-running":
            assert outputs[rid] == steps[:5]
        else:
            assert (outputs[rid], finished[rid]) == (steps, reason), rid
