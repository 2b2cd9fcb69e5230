"""Non-interleaved rotary position embedding (rotate_half), as transformers Qwen2 and the
official Kimi-Audio LM apply it: cos/sin built in fp32 and rounded to the model dtype."""

from __future__ import annotations

import torch
from torch import nn

from kimiaudio.layers.triton_support import use_triton


class RotaryEmbedding(nn.Module):
    """cos/sin for arbitrary positions from an fp32 table built lazily on the positions' device.

    The table covers max_position_embeddings positions (the official cache length); a caller
    that needs more (the engine, from its max_model_len) calls `ensure_length` up front.
    """

    def __init__(self, head_dim: int, base: float, max_position_embeddings: int):
        super().__init__()
        self.head_dim = head_dim
        self.base = base
        self.max_position_embeddings = max_position_embeddings
        self._cos: torch.Tensor | None = None  # fp32 [P, D]
        self._sin: torch.Tensor | None = None

    def ensure_length(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The fp32 cos and sin tables [P, D] of at least `length` positions on `device`."""
        cos, sin = self._cos, self._sin
        if cos is not None and sin is not None and cos.device == device and cos.shape[0] >= length:
            return cos, sin
        length = max(length, self.max_position_embeddings)
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim))
        t = torch.arange(length, device=device, dtype=torch.float32)
        freqs = t[:, None] * inv_freq[None, :]  # [P, D/2], the official einsum("i,j->ij")
        emb = torch.cat((freqs, freqs), dim=-1)  # [P, D]
        self._cos, self._sin = emb.cos(), emb.sin()
        return self._cos, self._sin

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] long -> cos, sin [T, 1, D] in `dtype` (broadcast over heads)."""
        cos, sin = self.ensure_length(self.max_position_embeddings, positions.device)
        # fp32 values rounded to the model dtype, as the official cos_cached.to(x.dtype).
        return cos[positions].to(dtype)[:, None, :], sin[positions].to(dtype)[:, None, :]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D], cos/sin [T, 1, D] -> x rotated (in x's dtype)."""
    return x * cos + rotate_half(x) * sin


def apply_rotary_qk(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D] and k [T, Hkv, D] rotated: one Triton kernel for both on CUDA (torch
    takes five ops per tensor)."""
    if use_triton(q.device):
        from kimiaudio.layers import triton_ops

        return triton_ops.rotary(q, k, cos, sin)
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
