"""Every Triton kernel compiles for an H100 (sm_90) with the 7B's shapes, without a GPU.

The interpreter tests (test_triton_attention.py, test_triton_layers.py) check what the
kernels compute; this checks that the real compiler (Triton's front end, LLVM and the ptxas
bundled with the triton wheel) takes them, in bf16 and fp32, and that none spills registers
in bf16. Skipped where triton is not installed. The compiling runs in a process of its own
(`python tests/test_triton_compile.py`): the interpreter, which other test modules turn on,
leaves triton.language patched for the rest of a process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler import compile as triton_compile
from triton.runtime.jit import JITFunction  # noqa: E402

from kimiaudio.engine import (
    triton_attention,  # noqa: E402
    triton_kv_store,  # noqa: E402
)
from kimiaudio.layers import (
    fp8_quant,  # noqa: E402
    skinny_gemm,  # noqa: E402
    triton_ops,  # noqa: E402
)
from kimiaudio.layers.gemm_tiles import CANDIDATES, DEFAULTS, Tile  # noqa: E402

H100 = GPUTarget("cuda", 90, 32)


def kernels(dt: str):
    """(kernel, argument types, constexprs, options) with the 7B's shapes in dtype `dt`."""
    p = f"*{dt}"
    decode = dict(
        q_ptr=p,
        k_cache_ptr=p,
        v_cache_ptr=p,
        block_tables_ptr="*i32",
        context_lens_ptr="*i64",
        out_ptr=p,
        m_ptr="*fp32",
        l_ptr="*fp32",
        acc_ptr="*fp32",
        semaphore_ptr="*i32",
        scale_log2="fp32",
    )
    ints = (
        "block_size partition_size num_partitions stride_qb stride_qh stride_ob stride_oh stride_kb stride_ks "
        "stride_kh stride_vb stride_vs stride_vh stride_bt"
    ).split()
    decode.update(dict.fromkeys(ints, "i32"))
    yield (
        triton_attention._decode_partition_kernel,
        decode,
        dict(GROUP=7, GROUP_PAD=16, HEAD_DIM=128, TILE=32, SINGLE=True, DOT_FP32=dt == "fp32", PARTS_PAD=1, CHUNK=16),
        dict(num_warps=4),
    )
    yield (
        triton_attention._decode_partition_kernel,
        decode,
        dict(GROUP=7, GROUP_PAD=16, HEAD_DIM=128, TILE=32, SINGLE=False, DOT_FP32=dt == "fp32", PARTS_PAD=64, CHUNK=16),
        dict(num_warps=4),
    )
    store = dict(
        k_ptr=p,
        v_ptr=p,
        k_cache_ptr=p,
        v_cache_ptr=p,
        slots_ptr="*i64",
        **dict.fromkeys("stride_kt stride_kh stride_vt stride_vh stride_cs stride_ch".split(), "i32"),
    )
    yield triton_kv_store._store_kv_kernel, store, dict(NUM_KV_HEADS=4, HEADS_PAD=4, HEAD_DIM=128), {}
    rotary_store = dict(
        q_ptr=p,
        k_ptr=p,
        v_ptr=p,
        cos_ptr=p,
        sin_ptr=p,
        q_out_ptr=p,
        k_cache_ptr=p,
        v_cache_ptr=p,
        slots_ptr="*i64",
        **dict.fromkeys("stride_qt stride_qh stride_kt stride_kh stride_vt stride_vh".split(), "i32"),
        **dict.fromkeys("stride_cos stride_sin stride_cs stride_ch".split(), "i32"),
    )
    yield triton_kv_store._rotary_store_kernel, rotary_store, dict(NUM_Q_HEADS=28, HEAD_DIM=128), dict(num_warps=1)
    norm = dict(
        x_ptr=p,
        residual_ptr=p,
        weight_ptr=p,
        out_ptr=p,
        sum_ptr=p,
        stride_x="i32",
        stride_r="i32",
        num_cols="i32",
        eps="fp32",
    )
    norm["scale_ptr"] = "*fp32"
    for quantize in (False, True):
        constexprs = dict(HAS_RESIDUAL=True, QUANTIZE=quantize, INTERPRETED=False, BLOCK=4096)
        yield (
            triton_ops._rms_norm_kernel,
            {**norm, "out_ptr": "*fp8e4nv" if quantize else p},
            constexprs,
            dict(num_warps=16),
        )
    rotary = dict(
        q_ptr=p,
        k_ptr=p,
        cos_ptr=p,
        sin_ptr=p,
        q_out_ptr=p,
        k_out_ptr=p,
        **dict.fromkeys("stride_qt stride_qh stride_kt stride_kh stride_cos stride_sin".split(), "i32"),
    )
    yield triton_ops._rotary_kernel, rotary, dict(NUM_Q_HEADS=28, NUM_KV_HEADS=4, HEAD_DIM=128), dict(num_warps=1)
    silu = dict(x_ptr=p, out_ptr=p, scale_ptr="*fp32", stride_x="i32", num_cols="i32")
    for quantize in (False, True):
        constexprs = dict(BLOCK=1024, QUANTIZE=quantize, INTERPRETED=False)
        yield triton_ops._silu_and_mul_kernel, {**silu, "out_ptr": "*fp8e4nv" if quantize else p}, constexprs, {}
    quant = dict(x_ptr=p, q_ptr="*fp8e4nv", scale_ptr="*fp32", stride_x="i32", num_cols="i32")
    yield fp8_quant._quantize_rows_kernel, quant, dict(BLOCK=4096, INTERPRETED=False), dict(num_warps=8)
    yield from skinny_kernels(dt)


def skinny_kernels(dt: str):
    """The skinny GEMM with each default tile of its weight format (fp8 needs sm_89+: the H100
    has it), gated (the down projection) where it may be, and, in bf16 (serving), every
    candidate the tuner may choose for each format."""
    for fmt, w in (("fp8", "fp8e4nv"), ("int8", "i8"), ("bf16", dt)):
        tiles = {t for t in DEFAULTS[fmt] if isinstance(t, Tile)}
        if dt == "bf16":
            tiles |= {t for bucket in CANDIDATES[fmt] for t in bucket if isinstance(t, Tile)}
        for tile in sorted(tiles, key=str):
            types = dict(x_ptr=f"*{dt}", w_ptr=f"*{w}", scale_ptr="*fp32", bias_ptr=f"*{dt}", out_ptr=f"*{dt}")
            types.update(partial_ptr="*fp32", semaphore_ptr="*i32")
            types.update(dict.fromkeys("M N K blocks_per_split stride_xm stride_wn stride_om".split(), "i32"))
            for gated in (False, True) if tile in DEFAULTS["fp8"][:3] else (False,):
                constexprs = dict(
                    HAS_SCALE=w != dt,
                    HAS_BIAS=True,
                    GATED=gated,
                    DOT=tile.dot,
                    DOT_FP32=dt == "fp32",
                    EVEN_K=True,
                    ASM=True,
                    BLOCK_M=tile.block_m,
                    BLOCK_N=tile.block_n,
                    BLOCK_K=tile.block_k,
                )
                options = dict(num_warps=tile.num_warps, num_stages=tile.num_stages)
                yield skinny_gemm._skinny_gemm_kernel, types, constexprs, options


def compile_all(dt: str) -> None:
    for kernel, types, constexprs, options in kernels(dt):
        fn = JITFunction(kernel.fn)  # the kernel's Python source, whatever `kernel` was made into
        signature = {name: "constexpr" if name in constexprs else types[name] for name in fn.arg_names}
        compiled = triton_compile(ASTSource(fn, signature, constexprs), target=H100, options=options)
        assert compiled.asm["cubin"], fn.__name__
        if dt == "bf16":  # fp32 is the tests' dtype: its fp32 dots may spill; bf16 (serving) must not
            assert "ld.local" not in compiled.asm["ptx"], f"{fn.__name__} spills registers"
        print("compiled", fn.__name__, constexprs)


@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_kernels_compile_for_h100(dt):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, __file__, dt], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


if __name__ == "__main__":
    compile_all(sys.argv[1])
