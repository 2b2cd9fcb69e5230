"""Triton kernels of the decoder layer's elementwise work: one launch where torch takes 2-12.

Imported only once a kernel is chosen (triton_support.use_triton); the torch code beside
each dispatcher (norm.py, rotary.py, activation.py) is the reference. Each kernel rounds to
the model dtype where the official bf16 code's separate torch ops round, so that in bf16 it
gives the official values (up to the last bit of fp32 intermediates) and in fp32 the same:
- `rms_norm`: optional residual add (rounded), then x * rsqrt(mean(x^2) + eps) in fp32,
  rounded, times the weight: one kernel per row instead of add + 4;
- `rotary`: q and k of every token rotated in one launch (x * cos + rotate_half(x) * sin,
  each product rounded) instead of 5 ops per tensor;
- `silu_and_mul`: silu(gate) rounded, times up, from the fused gate/up GEMM's output;
- `int8_linear`: an int8-weight GEMM (layers/int8.py): each int8 weight tile is converted in
  registers and multiplied in the activations' dtype with fp32 accumulation, the per-channel
  scale (and the bias) applied once to the accumulator, so the weights are read at one byte each.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kimiaudio.layers.triton_support import interpreting


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    sum_ptr,
    stride_x,
    stride_r,
    num_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < num_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * num_cols + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt_rn(tl.sum(xf * xf, 0) / num_cols + eps)
    y = (xf * inv_rms).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * num_cols + cols, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [T, H] (rows contiguous) -> (norm(x + residual) * weight, x + residual)."""
    rows, cols = x.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty(x.shape, device=x.device, dtype=torch.promote_types(x.dtype, weight.dtype))
    total = torch.empty_like(x) if residual is not None else x
    if rows:
        block = triton.next_power_of_2(cols)
        _rms_norm_kernel[(rows,)](
            x,
            x if residual is None else residual,
            weight,
            out,
            total,
            x.stride(0),
            0 if residual is None else residual.stride(0),
            cols,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            num_warps=min(16, max(1, block // 256)),
        )
    return out, total


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_out_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cos,
    stride_sin,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)  # q heads, then k heads
    d = tl.arange(0, HEAD_DIM)
    partner = (d + HEAD_DIM // 2) % HEAD_DIM
    sign = tl.where(d < HEAD_DIM // 2, -1.0, 1.0)  # rotate_half: [-x2, x1]
    if head < NUM_Q_HEADS:
        src = q_ptr + token * stride_qt + head * stride_qh
        dst = q_out_ptr + (token * NUM_Q_HEADS + head) * HEAD_DIM
    else:
        src = k_ptr + token * stride_kt + (head - NUM_Q_HEADS) * stride_kh
        dst = k_out_ptr + (token * NUM_KV_HEADS + head - NUM_Q_HEADS) * HEAD_DIM
    dtype = q_out_ptr.dtype.element_ty
    x = tl.load(src + d).to(tl.float32)
    rotated = tl.load(src + partner).to(tl.float32) * sign
    cos = tl.load(cos_ptr + token * stride_cos + d).to(tl.float32)
    sin = tl.load(sin_ptr + token * stride_sin + d).to(tl.float32)
    out = (x * cos).to(dtype).to(tl.float32) + (rotated * sin).to(dtype).to(tl.float32)
    tl.store(dst + d, out.to(dtype))


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hkv, D] (any row strides), cos/sin [T, 1, D] -> new contiguous q, k."""
    tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        q, k = q.contiguous(), k.contiguous()
    q_out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    k_out = torch.empty(k.shape, device=k.device, dtype=k.dtype)
    if tokens:
        _rotary_kernel[(tokens, num_heads + num_kv_heads)](
            q,
            k,
            cos,
            sin,
            q_out,
            k_out,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            cos.stride(0),
            sin.stride(0),
            NUM_Q_HEADS=num_heads,
            NUM_KV_HEADS=num_kv_heads,
            HEAD_DIM=head_dim,
            num_warps=1,
        )
    return q_out, k_out


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, num_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < num_cols
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + num_cols + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * num_cols + cols, (silu * up).to(dtype), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] = [gate | up] -> silu(gate) * up [T, I]."""
    rows, cols = x.shape[0], x.shape[1] // 2
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty(rows, cols, device=x.device, dtype=x.dtype)
    if rows:
        block = 1024
        _silu_and_mul_kernel[(rows, triton.cdiv(cols, block))](x, out, x.stride(0), cols, BLOCK=block, num_warps=4)
    return out


@triton.jit
def _int8_linear_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    HAS_BIAS: tl.constexpr,
    IEEE_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + k[None, :], mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0
        )
        w = tl.load(
            w_ptr + cols[None, :] * stride_wn + k[:, None], mask=(cols[None, :] < N) & (k[:, None] < K), other=0
        )  # [BLOCK_K, BLOCK_N]: the weight tile transposed
        if IEEE_FP32:  # no TF32 rounding: fp32 activations give the dequantized product
            acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        else:  # int8 values are exact in bf16 / fp16
            acc += tl.dot(x, w.to(tl.float32).to(x.dtype))
    acc = acc * tl.load(scale_ptr + cols, mask=cols < N, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(
        out_ptr + rows[:, None] * stride_om + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=(rows[:, None] < M) & (cols[None, :] < N),
    )


def int8_linear(
    x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, block_n: int | None = None
) -> torch.Tensor:
    """x [T, K] @ (qweight [N, K] int8 * scale [N] fp32)^T + bias -> [T, N] in x's dtype.
    `block_n` (16, 32 or 64) overrides the tile width the kernel picks (tests run each)."""
    rows, k = x.shape
    n = qweight.shape[0]
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty(rows, n, device=x.device, dtype=x.dtype)
    if rows:
        # Decode batches are a few rows: the smallest tile tl.dot takes, so no rows are wasted.
        block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
        block_k = 128
        if block_n is None:
            block_n = _int8_tile_width(triton.cdiv(rows, block_m), n, x.device)
        # Triton 3.9's interpreter computes bf16 tl.dot wrongly (1e10 off on a 16x16 tile):
        # there every dtype is multiplied in fp32, which the bf16 result then rounds from.
        ieee = x.dtype == torch.float32 or interpreting()
        _int8_linear_kernel[(triton.cdiv(rows, block_m), triton.cdiv(n, block_n))](
            x,
            qweight,
            scale,
            x if bias is None else bias,
            out,
            rows,
            n,
            k,
            x.stride(0),
            qweight.stride(0),
            out.stride(0),
            HAS_BIAS=bias is not None,
            IEEE_FP32=ieee,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            num_warps=4,
        )
    return out


def _int8_tile_width(row_tiles: int, n: int, device: torch.device) -> int:
    """Output columns a program computes. A decode step's weight read is the whole cost, and
    it is spread over the GPU only with enough programs: o_proj and down_proj (3,584 outputs)
    at batch 1 give 56 programs of 64 columns on a 132-SM H100. Narrower tiles until there
    are two programs an SM, down to tl.dot's 16 (a heuristic, not yet tuned on a GPU)."""
    if device.type != "cuda":
        return 64  # the interpreter: fewest programs
    programs_wanted = 2 * _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    width = 64
    while width > 16 and row_tiles * triton.cdiv(n, width) < programs_wanted:
        width //= 2
    return width


@functools.cache
def _sm_count(index: int) -> int:
    """Streaming multiprocessors of a GPU, asked once (every eager int8 product wants it)."""
    return torch.cuda.get_device_properties(index).multi_processor_count
