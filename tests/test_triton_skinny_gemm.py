"""The skinny GEMM (layers/skinny_gemm.py) against the fp32 product of its dequantized weights.

Compiled on a GPU; in Triton's interpreter on CPU tensors without one, at widths that are not
multiples of any tile (N = 70 outputs, K = 200 or 2 x 176 inputs: a K tail) and the decode
buckets' row counts (1, 3, 17, 64), with K split among programs so that the in-launch
reduction runs. In fp32 the product must be the reference's to rounding; in bf16 its one
rounding of the output. The PTX that widens 8-bit weights on a GPU cannot run in the
interpreter: its instructions are executed here by a small model of them, for every byte.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from kimiaudio.layers import fp8, int8, skinny_gemm, triton_ops, weight_widening  # noqa: E402
from kimiaudio.layers.gemm_tiles import DEFAULTS, LARGE, SEMAPHORES, TORCH, Tile, split_k  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def weights(fmt: str, n: int, k: int, dtype: torch.dtype, seed: int = 0):
    """(weight as the kernel reads it, scale or None, fp32 weight the product must use)."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    w[3] = 0  # an all-zero output channel
    w[5] *= 40  # a loud one
    if fmt == "int8":
        q, scale = int8.quantize_rows(w)
    elif fmt == "fp8":
        q, scale = fp8.quantize_rows(w)
    else:  # "bf16" / "fp32": a 16-bit (or fp32) layer's own weight
        q, scale = w.to(dtype), None
    dense = q.float() * (1 if scale is None else scale[:, None])
    return q.to(DEVICE), None if scale is None else scale.to(DEVICE), dense


def reference(x: torch.Tensor, dense: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.cpu().double() @ dense.double().t()
    return out if bias is None else out + bias.cpu().double()


def check(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got.cpu().double(), expected, atol=1e-4, rtol=1e-5)
    else:  # fp32 sums, one bf16 rounding of the output (8 bits of mantissa)
        torch.testing.assert_close(got.cpu().double(), expected, atol=1e-2, rtol=2.0**-7)


# (weights, model dtype, rows, tile): each bucket's tile shape (shrunk along K where the
# interpreter would take long) and the other inner products, in the formats served.
BF16, FP32 = torch.bfloat16, torch.float32
GEMV1, GEMV2, GEMV4 = Tile(1, 32, 32, dot=False), Tile(2, 64, 32, dot=False), Tile(4, 32, 32, dot=False)
DOT16, DOT64 = Tile(16, 32, 64, dot=True), Tile(64, 64, 32, dot=True)
CASES = [
    *[("fp8", BF16, rows, tile) for rows, tile in [(1, GEMV1), (1, Tile(1, 128, 64, dot=False)), (3, GEMV4)]],
    *[("fp8", BF16, rows, tile) for rows, tile in [(3, GEMV2), (3, DOT16), (17, DOT16), (64, DOT64)]],
    *[("int8", BF16, rows, tile) for rows, tile in [(1, GEMV1), (3, GEMV4), (17, DOT16), (64, DOT64)]],
    *[("bf16", BF16, rows, tile) for rows, tile in [(1, GEMV1), (3, GEMV2), (3, DOT16), (64, DOT64)]],
    *[("fp8", FP32, rows, tile) for rows, tile in [(1, GEMV1), (17, DOT16)]],
    *[("int8", FP32, rows, tile) for rows, tile in [(3, GEMV2), (64, DOT64)]],
    *[("fp32", FP32, rows, tile) for rows, tile in [(1, GEMV1), (3, DOT16)]],  # a 16-bit layer in fp32
]


@pytest.mark.parametrize("fmt, dtype, rows, tile", CASES)
def test_product_of_the_dequantized_weight(fmt, dtype, rows, tile):
    n, k = 70, 200  # a tail in N and in K
    q, scale, dense = weights(fmt, n, k, dtype)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(rows, k, generator=gen).to(dtype).to(DEVICE)
    bias = torch.randn(n, generator=gen).to(dtype).to(DEVICE)
    sems = torch.zeros(SEMAPHORES, dtype=torch.int32, device=DEVICE)
    tiles = -(-rows // tile.block_m) * -(-n // tile.block_n)
    assert split_k(tiles, k, tile.block_k, 64)[0] > 1  # the in-launch reduction runs
    got = skinny_gemm.skinny_linear(x, q, scale, bias, tile, sems, programs=64)
    check(got, reference(x, dense, bias), dtype)
    assert not sems.any()  # every semaphore reset for the next launch
    if rows == 3:
        again = skinny_gemm.skinny_linear(x, q, scale, bias, tile, sems, programs=64)
        assert torch.equal(got, again)  # split sums add in split order, whoever finishes first


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
@pytest.mark.parametrize("rows, tile", [(1, Tile(1, 64, 32, dot=False)), (3, Tile(16, 32, 32, dot=True))])
def test_gated_input_is_silu_and_mul_of_gate_and_up(fmt, rows, tile):
    # silu(gate) * up computed as the product loads it: the same bits as silu_and_mul's kernel
    # (tests/test_triton_layers.py holds that to torch's) followed by the plain product.
    n, k = 70, 176  # the down projection of a 176-wide MLP
    dtype = torch.bfloat16
    q, scale, dense = weights(fmt, n, k, dtype)
    gate_up = (torch.randn(rows, 2 * k, generator=torch.Generator().manual_seed(2)) * 3).to(dtype).to(DEVICE)
    sems = torch.zeros(SEMAPHORES, dtype=torch.int32, device=DEVICE)
    got = skinny_gemm.skinny_linear(gate_up, q, scale, None, tile, sems, gated=True, programs=64)
    activations = triton_ops.silu_and_mul(gate_up)
    assert torch.equal(got, skinny_gemm.skinny_linear(activations, q, scale, None, tile, sems, programs=64))
    check(got, reference(activations, dense, None), dtype)


def test_many_rows_and_no_split():
    # int8's compute tile for a prefill: more rows than a tile, K not split.
    q, scale, dense = weights("int8", 70, 200, torch.float32)
    x = torch.randn(100, 200, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    sems = torch.zeros(SEMAPHORES, dtype=torch.int32, device=DEVICE)
    got = skinny_gemm.skinny_linear(x, q, scale, None, Tile(32, 32, 64, dot=True, waves=1), sems, programs=1)
    check(got, reference(x, dense, None), torch.float32)


def test_bad_input_width_is_refused():
    q, scale, _ = weights("int8", 70, 200, torch.float32)
    sems = torch.zeros(SEMAPHORES, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="gated"):
        skinny_gemm.skinny_linear(torch.zeros(2, 200, device=DEVICE), q, scale, None, DEFAULTS["int8"][1], sems, True)


def test_split_k_only_while_tiles_leave_programs_idle():
    assert split_k(264, 3584, 128, 264) == (1, 3584)  # enough tiles: one pass over K
    splits, per = split_k(56, 18944, 256, 264)  # down_proj at batch 1: 56 tiles of 64
    assert per % 256 == 0 and splits * per >= 18944 and (splits - 1) * per < 18944 and 4 <= splits <= 5
    assert split_k(1, 256, 128, 264) == (1, 256)  # too little K to share
    assert all(t == TORCH or t.block_m * t.block_n <= 64 * 128 for fmt in DEFAULTS for t in DEFAULTS[fmt][:LARGE])


# --- the widening PTX, run by a model of its instructions ---


def _bf16x2(word: int) -> tuple[float, float]:
    halves = torch.tensor([word & 0xFFFF, word >> 16], dtype=torch.int32).to(torch.int16)
    return tuple(halves.view(torch.bfloat16).float().tolist())


def _to_bf16x2(a: float, b: float) -> int:
    halves = torch.tensor([a, b], dtype=torch.float32).to(torch.bfloat16).view(torch.int16).int() & 0xFFFF
    return int(halves[0]) | int(halves[1]) << 16


def _prmt(a: int, b: int, selector: int) -> int:
    pool = [(a >> 8 * i) & 0xFF for i in range(4)] + [(b >> 8 * i) & 0xFF for i in range(4)]
    return sum(pool[(selector >> 4 * i) & 0x7] << 8 * i for i in range(4))


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        index = ((a >> bit) & 1) << 2 | ((b >> bit) & 1) << 1 | ((c >> bit) & 1)
        out |= ((lut >> index) & 1) << bit  # LUT index: a = 0xF0, b = 0xCC, c = 0xAA
    return out


def run_ptx(asm: str, byte_word: int) -> tuple[int, int]:
    """Execute the widening asm on one input register -> its two output registers."""
    regs = {"$2": byte_word}

    def val(token: str) -> int:
        token = token.strip()
        return int(token, 16) if token.startswith("0x") else int(token) if token.isdigit() else regs[token]

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        dst, *src = [a.strip() for a in args.split(",")]
        if op == "mov.b32":
            regs[dst] = val(src[0])
        elif op == "prmt.b32":
            regs[dst] = _prmt(val(src[0]), val(src[1]), val(src[2]))
        elif op == "lop3.b32":
            regs[dst] = _lop3(val(src[0]), val(src[1]), val(src[2]), val(src[3]))
        elif op == "shr.b32":
            regs[dst] = val(src[0]) >> val(src[1])
        elif op == "fma.rn.bf16x2":
            (a0, a1), (b0, b1), (c0, c1) = (_bf16x2(val(s)) for s in src)
            regs[dst] = _to_bf16x2(a0 * b0 + c0, a1 * b1 + c1)  # exact here: one rounding
        else:
            raise AssertionError(f"no model of {op}")
    return regs["$0"], regs["$1"]


@pytest.mark.parametrize("name, dtype", [("_E4M3_TO_BF16", fp8.FP8), ("_INT8_TO_BF16", torch.int8)])
def test_widening_ptx_gives_every_byte_its_value(name, dtype):
    asm = getattr(weight_widening, name).value
    modelled = {"mov.b32", "prmt.b32", "lop3.b32", "shr.b32", "fma.rn.bf16x2"}
    assert set(re.findall(r"^([a-z][a-z0-9.]*) ", asm, re.M)) <= modelled  # run_ptx models each
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    for first in range(0, 256, 4):  # byte i of the register is element i: lane i % 2 of output i // 2
        word = sum(b << 8 * i for i, b in enumerate(range(first, first + 4)))
        lo, hi = run_ptx(asm, word)
        got = [*_bf16x2(lo), *_bf16x2(hi)]
        expected = values[first : first + 4].tolist()
        if dtype == fp8.FP8:  # 0x7F / 0xFF are NaN in e4m3fn and never a quantized weight
            got, expected = got[: 4 - (first == 124 or first == 252)], expected[: 4 - (first == 124 or first == 252)]
        assert got == expected, (first, got, expected)
