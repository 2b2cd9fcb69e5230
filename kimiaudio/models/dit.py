"""The detokenizer's flow-matching DiT (`audio_detokenizer/config.yaml` + `model.pt`).

Follows the official DiTPrefix (kimia_infer/models/detokenizer/flow_matching/model.py and
dit_block.py): semantic-token embedding as the condition, adaLN-Zero blocks, non-causal
attention over a cached prefix (post-RoPE K/V of earlier chunks) plus the current chunk,
interleaved complex RoPE by absolute position. Unlike the official batch-1 varlen call, a
forward takes a padded batch of sessions through a DiTContext (built by detok/dit_batch.py):
per-session condition and positions, K/V buffers holding each session's prefix, and a key mask,
so padding never changes a real row. The forward allocates nothing that outlives it and reads
only its arguments, so it can be captured in a CUDA graph. Attribute names are the
checkpoint's tensor names (after stripping "speech_model.").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kimiaudio.checkpoint.files import load_into, load_torch_file
from kimiaudio.models.dit_config import DiTConfig, rope_table, sincos_table
from kimiaudio.models.quantize import quantize_dit


@dataclass
class DiTContext:
    """What stays fixed over the ODE of one batch of chunks (B sessions, N padded frames)."""

    cond: Tensor  # [B, N, hidden] semantic-token embedding
    pos_emb: Tensor | None  # [B, N, hidden] (sincos / learnable position embedding)
    rope: Tensor | None  # [B, N, 1, head_dim/2] complex64
    k_bufs: list[Tensor]  # per block [B, heads, P+N, head_dim]: prefix in [:P], chunk written in [P:]
    v_bufs: list[Tensor]
    prefix_len: int  # P
    attn_mask: Tensor  # [B, 1, 1, P+N] bool, True = a real key (a session's prefix and chunk frames)


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: Tensor) -> Tensor:
        # [cos | sin] of t * exp(-ln(1e4) i / half), built in fp32, then cast: [B, hidden]
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t[:, None].float() * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return self.mlp(emb.to(next(self.mlp.parameters()).dtype))  # the first linear's weight


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: Tensor, ctx: DiTContext, idx: int) -> Tensor:
        b, n, h = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).unbind(2)  # [B, N, heads, hd]
        if ctx.rope is not None:
            q, k = _apply_rope(q, ctx.rope), _apply_rope(k, ctx.rope)
        k_all, v_all = ctx.k_bufs[idx], ctx.v_bufs[idx]  # [B, heads, P+N, hd]
        k_all[:, :, ctx.prefix_len :] = k.transpose(1, 2)
        v_all[:, :, ctx.prefix_len :] = v.transpose(1, 2)
        # non-causal: every frame sees the real prefix frames and the real frames of its chunk
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k_all, v_all, attn_mask=ctx.attn_mask)
        return self.proj(out.transpose(1, 2).reshape(b, n, h))


def _apply_rope(x: Tensor, rope: Tensor) -> Tensor:
    # interleaved pairs (x[2i], x[2i+1]) as complex numbers, rotated in fp32, cast back
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * rope).flatten(3).type_as(x)


class Mlp(nn.Module):
    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, inner)
        self.fc2 = nn.Linear(inner, hidden)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def _modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale) + shift


class DiTBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.attn = Attention(hidden, heads)
        self.mlp = Mlp(hidden, int(hidden * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 6 * hidden))

    def forward(self, x: Tensor, c: Tensor, ctx: DiTContext, idx: int) -> Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=2)
        h = x.shape[-1]
        x = x + gate1 * self.attn(_modulate(F.layer_norm(x, (h,), eps=1e-6), shift1, scale1), ctx, idx)
        return x + gate2 * self.mlp(_modulate(F.layer_norm(x, (h,), eps=1e-6), shift2, scale2))


class FinalLayer(nn.Module):
    def __init__(self, hidden: int, out: int):
        super().__init__()
        self.linear = nn.Linear(hidden, out)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=2)
        return self.linear(_modulate(F.layer_norm(x, (x.shape[-1],), eps=1e-6), shift, scale))


class DiTPrefix(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        self.weights = "bf16"  # its blocks' linear weights: bf16 (as loaded), fp8 or int8 (quantize.py)
        h = cfg.hidden_size
        self.t_embedder = TimestepEmbedder(h)
        self.semantic_token_embedding = nn.Embedding(cfg.semantic_vocab_size + 1, h)  # +1: CFG null row
        self.input_linear = nn.Linear(cfg.input_size, h)
        self.position_embedding: nn.Module
        if cfg.position_embedding_type == "learnable":
            self.position_embedding = nn.Embedding(cfg.max_seq_len + 1, h)
        elif cfg.position_embedding_type == "sincos":
            self.position_embedding = _SinCosHolder()
        self.blocks = nn.ModuleList(DiTBlock(h, cfg.num_heads, cfg.mlp_ratio) for _ in range(cfg.depth))
        self.final_layer = FinalLayer(h, cfg.input_size)
        # Plain attributes, not buffers: Module.to(bf16) would cast the complex table to real.
        self._rope = rope_table(cfg) if cfg.use_rope else None
        self._sincos = sincos_table(cfg.max_seq_len + 1, h) if cfg.position_embedding_type == "sincos" else None

    @property
    def kv_shape(self) -> tuple[int, int]:
        """(heads, head_dim) of one cached key/value frame."""
        return self.cfg.num_heads, self.cfg.head_dim

    def position_inputs(self, position_ids: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """position_ids [B, N] long -> (position embedding [B, N, hidden] or None,
        RoPE factors [B, N, 1, head_dim/2] complex64 or None): fixed over a chunk's ODE."""
        rope = None
        if self._rope is not None:
            if self._rope.device != position_ids.device:
                self._rope = self._rope.to(position_ids.device)
            rope = self._rope[position_ids].unsqueeze(2)
        return self._position_embedding(position_ids), rope

    def _position_embedding(self, position_ids: Tensor) -> Tensor | None:
        kind, dtype = self.cfg.position_embedding_type, self.input_linear.weight.dtype
        if kind == "learnable":
            return self.position_embedding(position_ids)
        if kind != "sincos":
            return None
        # fairseq make_positions with padding_idx 0: chunk-relative 1..n, position id 0 -> zero row
        nonzero = position_ids.ne(0).long()
        positions = torch.cumsum(nonzero, dim=1) * nonzero
        rows = int(positions.max()) + 1
        table = self._sincos
        if table is None or table.shape[0] < rows:
            table = sincos_table(rows, self.cfg.hidden_size)
        self._sincos = table = table.to(position_ids.device)
        return table.to(dtype)[positions]

    def forward(self, x: Tensor, t: Tensor, ctx: DiTContext) -> Tensor:
        """x [B, N, input_size], t [B] or [1] long timestep (t*1000) -> velocity [B, N, input_size].
        Every block also writes the chunk's post-RoPE K/V into ctx.k_bufs/v_bufs[..., P:, :]."""
        x = self.input_linear(x)
        if ctx.pos_emb is not None:
            x = x + ctx.pos_emb
        c = self.t_embedder(t).unsqueeze(1) + ctx.cond  # [B, N, hidden]
        for idx, block in enumerate(self.blocks):
            x = block(x, c, ctx, idx)
        return self.final_layer(x, c)


class _SinCosHolder(nn.Module):
    """Holds the official SinusoidalPositionalEmbedding's persistent `_float_tensor` buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("_float_tensor", torch.zeros(1))


def load_dit(directory: Path, device: torch.device, dtype: torch.dtype, weights: str = "bf16") -> DiTPrefix:
    """config.yaml + model.pt["state_dict"] (keys containing "speech_model", prefix stripped),
    moved to `device` block by block with its linears quantized as `weights` says
    (models/quantize.quantize_dit)."""
    directory = Path(directory)
    cfg = DiTConfig.from_yaml(directory / "config.yaml")
    path = directory / "model.pt"
    state = load_torch_file(path, "state_dict")
    state = {k.replace("speech_model.", ""): v for k, v in state.items() if "speech_model" in k}
    model = DiTPrefix(cfg)
    load_into(model, state, path)
    del state
    return quantize_dit(model, weights, torch.device(device), dtype).eval()
