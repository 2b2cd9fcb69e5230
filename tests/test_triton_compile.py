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

from kimiaudio.engine import triton_attention  # noqa: E402
from kimiaudio.layers import triton_ops  # noqa: E402

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
        dict(GROUP=7, GROUP_PAD=16, HEAD_DIM=128, TILE=32, SINGLE=True, DOT_FP32=dt == "fp32"),
        dict(num_warps=4),
    )
    yield (
        triton_attention._decode_partition_kernel,
        decode,
        dict(GROUP=7, GROUP_PAD=16, HEAD_DIM=128, TILE=32, SINGLE=False, DOT_FP32=dt == "fp32"),
        dict(num_warps=4),
    )
    merge = dict(
        context_lens_ptr="*i64",
        m_ptr="*fp32",
        l_ptr="*fp32",
        acc_ptr="*fp32",
        out_ptr=p,
        partition_size="i32",
        num_partitions="i32",
        stride_ob="i32",
        stride_oh="i32",
    )
    yield triton_attention._merge_partitions_kernel, merge, dict(NUM_HEADS=28, HEAD_DIM=128, PARTS_PAD=64, CHUNK=16), {}
    store = dict(
        k_ptr=p,
        v_ptr=p,
        k_cache_ptr=p,
        v_cache_ptr=p,
        slots_ptr="*i64",
        **dict.fromkeys("stride_kt stride_kh stride_vt stride_vh stride_cs stride_ch".split(), "i32"),
    )
    yield triton_attention._store_kv_kernel, store, dict(NUM_KV_HEADS=4, HEADS_PAD=4, HEAD_DIM=128), {}
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
    yield triton_ops._rms_norm_kernel, norm, dict(HAS_RESIDUAL=True, BLOCK=4096), dict(num_warps=16)
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
    yield (
        triton_ops._silu_and_mul_kernel,
        dict(x_ptr=p, out_ptr=p, stride_x="i32", num_cols="i32"),
        dict(BLOCK=1024),
        {},
    )


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
