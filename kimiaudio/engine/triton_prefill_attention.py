"""Triton kernel of paged attention for a flat batch of variable-length query runs.

Every sequence of a step contributes a run of consecutive query rows (a prefill chunk, or one
row for a decode) that sits at the end of its context: row i of a run of q_len sits at position
context_len - q_len + i and attends causally to the keys 0..that position, all read in place
from the paged KV pool through the sequence's block table (the run's own K/V are stored there
before the kernel runs). Imported only when the kernels are used (layers/triton_support.py);
the torch path of paged_attention.py is the reference the tests hold it to.

Follows the shape of vLLM's unified Triton attention, written for this pool: one program per
(tile of query rows, kv head). A tile holds BLOCK_Q consecutive query tokens of one sequence
times the GROUP query heads that share the kv head (grouped-query attention without copying
K/V per query head): tile row r is token r // GROUP, head r % GROUP. The program walks its
sequence's keys TILE_N at a time up to its last token's position, finds each key's block
through the block table, masks causally and keeps an online softmax (running max, sum and
weighted values in fp32): triton_paged_tiles.py's steps, which the decode kernel takes too.

Graph-safe: the grid is (num_tokens // BLOCK_Q + num_seqs, num_kv_heads), fixed by the
tensors' shapes; a program finds its sequence by a binary search over the run starts (run s
owns the tile indices from query_starts[s] // BLOCK_Q + s on), and tiles past a run's end
return at once. No host-device synchronisation and nothing read from the data on the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kimiaudio.engine.triton_attention import LOG2E
from kimiaudio.engine.triton_paged_tiles import attend_tile, load_kv_tile
from kimiaudio.layers.triton_support import interpreting

# Integer arguments that vary between eager steps: unspecialised, so a new value never
# compiles a new kernel variant in the middle of serving.
VARYING = ["num_seqs", "block_size", "stride_bt"]


@triton.jit
def _find_sequence(query_starts_ptr, tile, num_seqs, BLOCK_Q: tl.constexpr):
    """The last sequence s whose first tile index (query_starts[s] // BLOCK_Q + s) <= tile."""
    low = 0
    high = num_seqs
    while low < high:
        mid = (low + high) // 2
        first = tl.load(query_starts_ptr + mid) // BLOCK_Q + mid
        if first <= tile:
            low = mid + 1
        else:
            high = mid
    return low - 1


@triton.jit(do_not_specialize=VARYING)
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_starts_ptr,
    context_lens_ptr,
    out_ptr,
    scale_log2,
    num_seqs,
    block_size,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_sequence(query_starts_ptr, tile, num_seqs, BLOCK_Q)
    q_start = tl.load(query_starts_ptr + seq)
    q_len = tl.load(query_starts_ptr + seq + 1) - q_start
    first_token = (tile - (q_start // BLOCK_Q + seq)) * BLOCK_Q
    if first_token < q_len:
        prefix = tl.load(context_lens_ptr + seq).to(tl.int32) - q_len  # positions before the run
        r = tl.arange(0, BLOCK_M)
        token = first_token + r // GROUP  # [BLOCK_M] the row's token within the run
        head = kv_head * GROUP + r % GROUP
        rows = (r < BLOCK_Q * GROUP) & (token < q_len)
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(
            q_ptr + (q_start + token)[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh + d[None, :],
            mask=rows[:, None],
            other=0.0,
        )  # [BLOCK_M, D]
        if DOT_FP32:
            q = q.to(tl.float32)
        q_pos = prefix + token  # [BLOCK_M] each row's position: it sees keys 0..q_pos
        kv_end = prefix + tl.minimum(first_token + BLOCK_Q, q_len)  # keys any row of the tile sees
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the scores (log2 units)
        denom = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(score - m)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # running sum of exp2(score - m) * v
        table = block_tables_ptr + seq * stride_bt
        t = tl.arange(0, TILE_N)
        for tile_start in range(0, kv_end, TILE_N):
            pos = tile_start + t  # [TILE_N] key positions
            valid = pos < kv_end
            k, v = load_kv_tile(
                k_cache_ptr,
                v_cache_ptr,
                table,
                pos,
                valid,
                kv_head,
                d,
                block_size,
                stride_kb,
                stride_ks,
                stride_kh,
                stride_vb,
                stride_vs,
                stride_vh,
            )  # [TILE_N, D] each
            seen = valid[None, :] & (pos[None, :] <= q_pos[:, None])
            m, denom, acc = attend_tile(q, k, v, seen, m, denom, acc, scale_log2, DOT_FP32)
        out = acc / tl.where(denom > 0, denom, 1.0)[:, None]  # a row with no key: zeros
        tl.store(
            out_ptr + (q_start + token)[:, None].to(tl.int64) * stride_ot + head[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=rows[:, None],
        )


def tile_sizes(group: int, head_dim: int, itemsize: int, interpreted: bool) -> tuple[int, int, int]:
    """-> (BLOCK_M query rows of a tile, BLOCK_Q tokens in it, TILE_N keys per iteration).
    Small tiles in the interpreter (every program runs in Python); on a GPU about 64 rows, and
    K/V tiles of at most 16 KiB each (64 keys of 128 bf16 dimensions), so that the loop's
    pipelined loads fit shared memory in fp32 too."""
    rows = 16 if interpreted else 64
    block_m = max(rows, triton.next_power_of_2(group))
    tile_n = 16 if interpreted else max(16, min(64, (16 << 10) // (head_dim * itemsize)))
    return block_m, block_m // group, tile_n


def paged_prefill_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_starts: torch.Tensor,
    context_lens: torch.Tensor,
) -> torch.Tensor:
    """q [T, Hq, D] (runs of rows, one per sequence); k/v_cache [num_blocks, block_size, Hkv, D];
    block_tables [S, W] int32; query_starts [S + 1] int32 (run s is rows query_starts[s] up to
    query_starts[s + 1], the last entry <= T); context_lens [S] (keys of each sequence, the
    run's own included: >= the run's length) -> [T, Hq, D] in q's dtype, scale 1/sqrt(D). Rows
    of a sequence with no key, and rows outside every run, come out zero (a graph's warm-up
    runs over buffers that describe no step yet)."""
    num_tokens, num_heads, head_dim = q.shape
    q = q if q.stride(-1) == 1 else q.contiguous()
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    num_seqs = block_tables.shape[0]
    interpreted = interpreting() or q.device.type != "cuda"
    block_m, block_q, tile_n = tile_sizes(group, head_dim, k_cache.element_size(), interpreted)
    out = torch.zeros_like(q)
    _prefill_kernel[(num_tokens // block_q + num_seqs, num_kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        query_starts,
        context_lens,
        out,
        head_dim**-0.5 * LOG2E,
        num_seqs,
        block_size,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        GROUP=group,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        HEAD_DIM=head_dim,
        TILE_N=tile_n,
        DOT_FP32=q.dtype == torch.float32 or interpreting(),
        num_warps=4,
    )
    return out
