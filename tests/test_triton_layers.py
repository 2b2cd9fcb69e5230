"""The decoder layer's Triton kernels (layers/triton_ops.py) against their torch references.

Compiled on a GPU; in Triton's interpreter on CPU tensors without one (TRITON_INTERPRET=1 is
set here then); skipped where triton is not installed. In fp32 the kernels must give the
reference's values to rounding; in bf16 one or two bf16 steps apart at most (the interpreter
rounds its bf16 casts by truncation).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from kimiaudio.layers import triton_ops  # noqa: E402
from kimiaudio.layers.activation import silu_mul  # noqa: E402
from kimiaudio.layers.norm import rms_norm_reference  # noqa: E402
from kimiaudio.layers.rotary import RotaryEmbedding, apply_rotary  # noqa: E402
from kimiaudio.layers.triton_support import kernel_mode  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-2, rtol=2e-2)}
DTYPES = [torch.float32, torch.bfloat16]


def randn(*shape, dtype, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 3584])
def test_rms_norm_with_and_without_residual(dtype, hidden):
    weight = randn(hidden, dtype=dtype, seed=1)
    x, residual = randn(5, hidden, dtype=dtype), randn(5, hidden, dtype=dtype, seed=2)
    for res in (None, residual):
        expected_out, expected_sum = rms_norm_reference(x, weight, 1e-6, res)
        out, total = triton_ops.rms_norm(x, weight, 1e-6, res)
        assert out.dtype == dtype
        if dtype == torch.float32 or DEVICE.type == "cuda":
            assert torch.equal(total, expected_sum)  # one rounded add, as torch's
        torch.testing.assert_close(total.float(), expected_sum.float(), **TOL[dtype])
        torch.testing.assert_close(out.float(), expected_out.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_of_q_and_k_views(dtype):
    tokens, heads, kv_heads, head_dim = 6, 4, 2, 32
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)  # one GEMM's output
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim)  # strided views
    rotary = RotaryEmbedding(head_dim, 1e6, 64)
    cos, sin = rotary(torch.tensor([0, 1, 5, 17, 40, 63], device=DEVICE), dtype)
    got_q, got_k = triton_ops.rotary(q, k, cos, sin)
    assert got_q.is_contiguous() and got_k.shape == k.shape
    torch.testing.assert_close(got_q.float(), apply_rotary(q, cos, sin).float(), **TOL[dtype])
    torch.testing.assert_close(got_k.float(), apply_rotary(k, cos, sin).float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype):
    gate_up = randn(3, 2 * 1500, dtype=dtype) * 3  # 1500: not a multiple of the kernel's block
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(triton_ops.silu_and_mul(gate_up).float(), silu_mul(gate, up).float(), **TOL[dtype])


def test_golden_forward_through_the_kernels(golden_checkpoint, golden, monkeypatch):
    from helpers.engine_scenarios import load_tiny_lm
    from helpers.lm_golden import SECTIONS, forward_logits
    from helpers.lm_golden import TOL as GOLDEN_TOL

    lm = load_tiny_lm(golden_checkpoint, DEVICE)
    monkeypatch.setenv("KIMIAUDIO_KERNELS", "triton")
    kernel_mode.cache_clear()
    # Every section on a GPU; in the interpreter (every program in Python) one, text and audio out.
    sections = SECTIONS if DEVICE.type == "cuda" else ["lm.both"]
    try:
        for section in sections:
            text_logits, audio_logits = forward_logits(lm, golden, section)
            torch.testing.assert_close(text_logits, golden[f"{section}.forward.text_logits"][0], **GOLDEN_TOL)
            torch.testing.assert_close(audio_logits, golden[f"{section}.forward.audio_logits"][0], **GOLDEN_TOL)
    finally:
        monkeypatch.delenv("KIMIAUDIO_KERNELS")
        kernel_mode.cache_clear()
