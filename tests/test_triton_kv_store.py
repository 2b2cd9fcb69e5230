"""The decode step's rotary-and-store kernel (engine/triton_kv_store.py) against the two kernels
it replaces, triton_ops.rotary and store_kv_triton (each held to torch by its own tests), and
the decode backend's fused path against its unfused one.

Compiled on a GPU; in Triton's interpreter on CPU tensors without one.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from kimiaudio.engine.decode_attention import DecodeMetadata, PagedDecodeAttention  # noqa: E402
from kimiaudio.engine.kv_pool import KVPool  # noqa: E402
from kimiaudio.engine.triton_kv_store import rotary_store_triton, store_kv_triton  # noqa: E402
from kimiaudio.layers import triton_ops  # noqa: E402
from kimiaudio.layers.rotary import RotaryEmbedding  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def step_inputs(dtype: torch.dtype, tokens: int = 5, heads: int = 4, kv_heads: int = 2, head_dim: int = 32):
    """q, k, v as views of one qkv GEMM output, cos/sin of scattered positions, fresh pools."""
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype).to(DEVICE)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q = q.view(tokens, heads, head_dim)
    k, v = k.view(tokens, kv_heads, head_dim), v.view(tokens, kv_heads, head_dim)
    cos, sin = RotaryEmbedding(head_dim, 1e6, 64)(torch.tensor([0, 3, 17, 40, 63][:tokens], device=DEVICE), dtype)
    pools = [KVPool(2, 9, 4, kv_heads, head_dim, DEVICE, dtype) for _ in range(2)]
    return q, k, v, cos, sin, pools


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_store_equals_rotary_then_store(dtype):
    q, k, v, cos, sin, (fused, apart) = step_inputs(dtype)
    slots = torch.tensor([3, 17, 36, 0, 22], device=DEVICE)
    got_q = rotary_store_triton(fused.keys(1), fused.values(1), slots, q, k, v, cos, sin)
    rotated_q, rotated_k = triton_ops.rotary(q, k, cos, sin)
    store_kv_triton(apart.keys(1), apart.values(1), slots, rotated_k, v)
    assert torch.equal(got_q, rotated_q) and got_q.is_contiguous()
    assert torch.equal(fused.kv, apart.kv)  # layer 1 at those slots, nothing else
    assert fused.kv[:, 0].abs().sum() == 0


def test_decode_backend_rotates_in_its_store_kernel():
    q, k, v, cos, sin, (fused, apart) = step_inputs(torch.float32, tokens=3)
    tables = torch.tensor([[0, 1], [2, 9], [3, 9]], dtype=torch.int32, device=DEVICE)  # 9: the scratch block
    lengths = torch.tensor([6, 1, 3], device=DEVICE)
    slots = torch.tensor([5, 8, 14], device=DEVICE)  # each row's last position
    outputs = []
    for pool in (fused, apart):
        meta = DecodeMetadata.create(tables, lengths, pool.block_size, torch.float32, use_kernel=True)
        backend = PagedDecodeAttention(pool, slots, meta)
        assert backend.fuses_rotary
        if pool is fused:
            outputs.append(backend.rotate_and_attend(0, q, k, v, cos, sin))
        else:
            rotated_q, rotated_k = triton_ops.rotary(q, k, cos, sin)
            outputs.append(backend(0, rotated_q, rotated_k, v))
    assert torch.equal(fused.kv, apart.kv) and torch.equal(outputs[0], outputs[1])
    meta = DecodeMetadata.create(tables, lengths, fused.block_size, torch.float32, use_kernel=False)
    assert not PagedDecodeAttention(fused, slots, meta).fuses_rotary  # the torch path rotates apart
