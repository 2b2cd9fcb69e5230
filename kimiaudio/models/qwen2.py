"""Qwen2 decoder building blocks, shared by the Kimi-Audio trunk and its MIMO branch.

Follows transformers' Qwen2 (and the official modeling_moonshot_kimia.py, which reuses it):
pre-norm layers `h += o_proj(attn(rms(h)))`, `h += down(silu(gate(x)) * up(x))` (each add done
by the next norm, fused with it: layers pass (block output, residual) pairs); q/k/v have a
bias, o_proj and the MLP none; GQA; non-interleaved RoPE (rotate_half). Numerics as official:
RMSNorm computes in fp32 and casts back before the weight multiply; cos/sin are computed in
fp32 and cast to the model dtype before they are applied. Tensors are token-major [T, ...]:
the tokens of every sequence in a batch are packed along T and the attention backend knows
which sequence each belongs to. Attribute names equal the checkpoint's tensor names.

`fuse_projections()` (called once the checkpoint is loaded by those names) replaces q/k/v_proj
by one `qkv_proj` and gate/up_proj by one `gate_up_proj`, as nano-vllm's merged linears: one
GEMM reads the concatenated weights instead of three (two) reading theirs, which matters at
decode, where every GEMM is a pass over its weights. The concatenation is per layer, so the
device never holds two copies of the model. The linears are DecodeLinear (nn.Linear with the
skinny GEMM for decode batches) or, quantized, QuantLinear: the down projection takes the
gate/up output itself (forward_gated), and an fp8 projection on `_scaled_mm` takes its input
quantized by the norm (or silu-and-mul) kernel that makes it (takes_fp8_rows).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from kimiaudio.layers.activation import silu_mul
from kimiaudio.layers.attention import AttentionBackend, RotaryAttentionBackend
from kimiaudio.layers.decode_linear import DecodeLinear
from kimiaudio.layers.norm import RMSNorm
from kimiaudio.layers.quant_linear import QuantLinear
from kimiaudio.layers.rotary import apply_rotary_qk


def fuse_linears(parent: nn.Module, names: tuple[str, ...], fused_name: str) -> None:
    """Replace the Linear children `names` of `parent` by one Linear `fused_name` whose output
    is theirs concatenated in that order; the originals are freed. No-op once fused."""
    if getattr(parent, fused_name, None) is not None:
        return
    parts = [getattr(parent, name) for name in names]
    has_bias = parts[0].bias is not None
    weight = parts[0].weight
    fused = DecodeLinear(weight.shape[1], sum(p.weight.shape[0] for p in parts), bias=has_bias, device="meta")
    with torch.no_grad():
        fused.weight = nn.Parameter(torch.cat([p.weight for p in parts]), requires_grad=False)
        if has_bias:
            fused.bias = nn.Parameter(torch.cat([p.bias for p in parts]), requires_grad=False)
    for name in names:
        setattr(parent, name, None)  # drops the only reference: the original weights are freed
    setattr(parent, fused_name, fused)


class Qwen2Attention(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        hidden = config.hidden_size
        self.q_proj = DecodeLinear(hidden, self.num_heads * self.head_dim, bias=True)
        self.k_proj = DecodeLinear(hidden, self.num_kv_heads * self.head_dim, bias=True)
        self.v_proj = DecodeLinear(hidden, self.num_kv_heads * self.head_dim, bias=True)
        self.o_proj = DecodeLinear(self.num_heads * self.head_dim, hidden, bias=False)
        self.qkv_proj: DecodeLinear | QuantLinear | None = None  # set by fuse_projections (quantized at load)

    def fuse_projections(self) -> None:
        fuse_linears(self, ("q_proj", "k_proj", "v_proj"), "qkv_proj")

    def takes_fp8_rows(self, tokens: int) -> bool:
        """Whether x should come quantized (fp8.Fp8Rows): fp8 projections (fused) on `_scaled_mm`."""
        return self.qkv_proj is not None and self.qkv_proj.takes_fp8_rows(tokens)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, H] -> q [T, Hq*D], k, v [T, Hkv*D] (views of one GEMM's output once fused)."""
        if self.qkv_proj is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        kv = self.num_kv_heads * self.head_dim
        return self.qkv_proj(x).split([self.num_heads * self.head_dim, kv, kv], dim=-1)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend, layer_idx: int
    ) -> torch.Tensor:
        tokens = x.shape[0]
        q, k, v = self.project(x)
        q = q.view(tokens, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = k.view(tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if getattr(attn, "fuses_rotary", False):  # one kernel rotates q, k and stores k, v
            out = cast(RotaryAttentionBackend, attn).rotate_and_attend(layer_idx, q, k, v, cos, sin)
        else:
            q, k = apply_rotary_qk(q, k, cos, sin)
            out = attn(layer_idx, q, k, v)  # [T, Hq, D]
        return self.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))


class Qwen2MLP(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.gate_proj = DecodeLinear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = DecodeLinear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = DecodeLinear(config.intermediate_size, config.hidden_size, bias=False)
        self.gate_up_proj: DecodeLinear | QuantLinear | None = None  # set by fuse_projections (quantized at load)

    def fuse_projections(self) -> None:
        fuse_linears(self, ("gate_proj", "up_proj"), "gate_up_proj")

    def takes_fp8_rows(self, tokens: int) -> bool:
        """Whether x should come quantized (fp8.Fp8Rows): an fp8 gate/up (fused) on `_scaled_mm`."""
        return self.gate_up_proj is not None and self.gate_up_proj.takes_fp8_rows(tokens)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is None:
            return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))
        # [T, 2I] -> silu(gate) * up [T, I] (fused into the down projection or its input's
        # quantization where they take it) -> [T, H]
        return self.down_proj.forward_gated(self.gate_up_proj(x))


class Qwen2DecoderLayer(nn.Module):
    """One pre-norm decoder layer; `layer_idx` is its KV-cache slot in the attention backend."""

    def __init__(self, config: Any, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.self_attn = Qwen2Attention(config)
        self.mlp = Qwen2MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, residual) [T, H] each -> the same pair after this layer.

        The residual stream is carried beside the block output and added by the next norm
        (one fused add-and-norm): the layer's output hidden state is h + residual. residual
        None: h is the input embedding.
        """
        tokens = h.shape[0]
        # residual <- h + residual; x quantized in the norm's kernel for an fp8 `_scaled_mm`
        x, residual = self.input_layernorm(h, residual, self.self_attn.takes_fp8_rows(tokens))
        h = self.self_attn(x, cos, sin, attn, self.layer_idx)
        x, residual = self.post_attention_layernorm(h, residual, self.mlp.takes_fp8_rows(tokens))
        return self.mlp(x), residual
