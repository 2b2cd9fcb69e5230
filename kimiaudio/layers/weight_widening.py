"""8-bit weights widened to the compute dtype in registers, exactly: what the skinny GEMM
(skinny_gemm.py) does to every weight tile it loads.

fp8 e4m3 and int8 values are exact in bf16, fp16 and fp32, so widening loses nothing; the cost is
in instructions per weight, which a decode step's GEMMs (bound by weight bytes) feel. On CUDA
the 8-bit -> bf16 case runs hand-written PTX (two to two and a half instructions a weight);
int8 -> fp32 reads the float of 2^23 + (w + 128); the rest are Triton's conversions.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Four 8-bit weights (one register) -> four bf16 (two registers, two each), with integer and
# bf16x2 instructions (2 to 2.5 a weight) instead of Triton's conversions (F2F.BF16.F16, 16 a clock and
# SM for e4m3; 4-5 instructions a weight for int8). Byte i of $2 becomes lane i % 2 of $(i // 2).
# e4m3: each byte moved to the high byte of a 16-bit lane; sign kept, exponent and mantissa
# shifted right by 4 into bf16's fields (which reads as w * 2^-120, subnormals included), then
# times 2^120 (0x7B80) in bf16x2 (an fma with -0: fma.bf16x2 runs on sm_80 and later).
_E4M3_TO_BF16 = tl.constexpr("""{
.reg .b32 lo, hi, scale, zero;
mov.b32 scale, 0x7B807B80;
mov.b32 zero, 0x80008000;
prmt.b32 lo, $2, 0, 0x1404;
prmt.b32 hi, $2, 0, 0x3424;
lop3.b32 $0, lo, 0x80008000, 0, 0xC0;
lop3.b32 $1, hi, 0x80008000, 0, 0xC0;
shr.b32 lo, lo, 4;
shr.b32 hi, hi, 4;
lop3.b32 $0, lo, 0x07F007F0, $0, 0xEA;
lop3.b32 $1, hi, 0x07F007F0, $1, 0xEA;
fma.rn.bf16x2 $0, $0, scale, zero;
fma.rn.bf16x2 $1, $1, scale, zero;
}""")
# int8: each byte moved to the low byte of a 16-bit lane; a = 128 + (w & 0x7F) and
# b = 128 + (w & 0x80) as bf16 (0x43xx), exact; w = a - b = fma(b, -1, a).
_INT8_TO_BF16 = tl.constexpr("""{
.reg .b32 lo, hi, a, b, minus;
mov.b32 minus, 0xBF80BF80;
prmt.b32 lo, $2, 0, 0x4140;
prmt.b32 hi, $2, 0, 0x4342;
lop3.b32 a, lo, 0x007F007F, 0x43004300, 0xEA;
lop3.b32 b, lo, 0x00800080, 0x43004300, 0xEA;
fma.rn.bf16x2 $0, b, minus, a;
lop3.b32 a, hi, 0x007F007F, 0x43004300, 0xEA;
lop3.b32 b, hi, 0x00800080, 0x43004300, 0xEA;
fma.rn.bf16x2 $1, b, minus, a;
}""")


@triton.jit
def widen(w, dtype: tl.constexpr, ASM: tl.constexpr):
    """A weight tile in the compute dtype, exactly. ASM (compiled kernels only: the interpreter
    runs no PTX): 8-bit -> bf16 in the packed PTX above. Without it, and for fp32 (the GEMV),
    int8 -> fp32 reads the float of 2^23 + (w + 128) instead of an I2F (16 a clock and SM);
    the rest are Triton's conversions (e4m3 -> fp16 / fp32 are packed F2FP instructions)."""
    if w.dtype == dtype:
        out = w
    elif ASM and (dtype == tl.bfloat16) and (w.dtype == tl.float8e4nv):
        out = tl.inline_asm_elementwise(_E4M3_TO_BF16, "=r,=r,r", [w], dtype=tl.bfloat16, is_pure=True, pack=4)
    elif ASM and (dtype == tl.bfloat16) and (w.dtype == tl.int8):
        out = tl.inline_asm_elementwise(_INT8_TO_BF16, "=r,=r,r", [w], dtype=tl.bfloat16, is_pure=True, pack=4)
    elif (w.dtype == tl.int8) and (dtype == tl.float32):
        byte = w.to(tl.uint8, bitcast=True).to(tl.uint32)
        out = (byte ^ 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0  # 2^23 + 128
    else:
        out = w.to(dtype)
    return out
