"""The attention seam between the model and its KV cache.

The model computes q/k/v (k already RoPE'd) for the T tokens of one forward and hands them to
an `AttentionBackend`, which stores k/v in its own cache and attends causally over each
sequence's cached history plus these tokens. The model never sees the cache layout, so the
batch-1 contiguous cache here (the reference loop's) and the engine's paged cache plug into
the same model code. layer_idx 0..L-1 are the trunk layers, L..L+M-1 the MIMO layers (the
official 34-entry past_key_values order).

`ContiguousKVCache` follows the official HF code: one sequence, per-layer [Hkv, S, D] caches
grown by torch.cat, exact softmax(q k^T / sqrt(D)) v with the causal mask aligned to the
bottom-right corner when q_len < kv_len (flash-attn >= 2.1 semantics).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class AttentionBackend(Protocol):
    """A backend may also rotate q and k itself, in the kernel that stores k and v: see
    RotaryAttentionBackend."""

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] (k post-RoPE) -> attention output [T, Hq, D]."""
        ...


class RotaryAttentionBackend(AttentionBackend, Protocol):
    """A backend that, while `fuses_rotary` is True, takes q and k before RoPE (cos/sin
    [T, 1, D]) through `rotate_and_attend`, which the model calls instead of calling it."""

    @property
    def fuses_rotary(self) -> bool: ...

    def rotate_and_attend(
        self,
        layer_idx: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor: ...


# The SDPA kernels an attention call may use: flash or memory-efficient, the math path where
# neither takes the inputs, never cuDNN's, which builds an execution plan for every new shape
# (an engine step's shapes vary with its batch: the first mixed step of a shape took 373 ms on
# an H200, later ones about 40 ms). Grouped-query attention through `enable_gqa` (torch 2.5+)
# reads each kv head once instead of materialising it `group` times.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
HAS_ENABLE_GQA = torch.__version__ >= "2.5"


def pin_sdpa_backends(device: torch.device) -> None:
    """Take cuDNN's kernel out of every SDPA call of the process, not only `sdpa`'s: the speech
    encoders' batches vary in shape as the engine's steps do (one to eight 30 s windows), and
    the DiT's and the encoders' attention go through transformers' or torch's SDPA directly.
    Process-wide, once, by the stack's loaders: sdpa_kernel's context sets and restores the
    process's flags, which the LM and detokenizer threads would otherwise race on."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """F.scaled_dot_product_attention on [B, H, T, D] over the SDPA_BACKENDS; q's heads may be
    a multiple of k/v's (GQA: query head h uses kv head h // group)."""
    group = q.shape[1] // k.shape[1]
    if group > 1 and not HAS_ENABLE_GQA:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    with sdpa_kernel(SDPA_BACKENDS):
        if group > 1 and HAS_ENABLE_GQA:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal GQA attention of the last Tq positions of one sequence over all S of its keys.

    q [Tq, Hq, D], k/v [S, Hkv, D] with Tq <= S; query i sits at position S - Tq + i and sees
    keys 0..S-Tq+i (bottom-right aligned mask). Returns [Tq, Hq, D]. Scale 1/sqrt(D).
    """
    num_queries, num_keys = q.shape[0], k.shape[0]
    # [1, H, T, D] layout for sdpa: its fused kernels (flash and memory-efficient on CUDA, the
    # flash kernel on the CPU) take only 4-d inputs; 3-d ones fall back to the math path, which
    # materialises the fp32 score matrix (and on the CPU ran 1.6-4x slower: T = 100..400).
    qh = q.transpose(0, 1)[None]
    kh = k.transpose(0, 1)[None]
    vh = v.transpose(0, 1)[None]
    if num_queries == 1:
        out = sdpa(qh, kh, vh)  # one query sees every key
    elif num_queries == num_keys:
        out = sdpa(qh, kh, vh, is_causal=True)
    else:
        offset = num_keys - num_queries
        rows = torch.arange(num_queries, device=q.device)[:, None] + offset
        mask = torch.arange(num_keys, device=q.device)[None, :] <= rows  # [Tq, S], True = attend
        out = sdpa(qh, kh, vh, attn_mask=mask)
    return out[0].transpose(0, 1)


class ContiguousKVCache:
    """Batch-1 KV cache: all T tokens of every call belong to one sequence, appended in order."""

    def __init__(self, num_layers: int, device: torch.device | str, dtype: torch.dtype):
        self.device = torch.device(device)
        self.dtype = dtype
        self.num_layers = num_layers  # every layer with a KV cache (trunk and MIMO)
        self.keys: list[torch.Tensor | None] = [None] * self.num_layers  # each [S, Hkv, D]
        self.values: list[torch.Tensor | None] = [None] * self.num_layers

    @property
    def num_tokens(self) -> int:
        """Tokens cached so far (the next token's position when positions start at 0)."""
        return 0 if self.keys[0] is None else self.keys[0].shape[0]

    def reset(self) -> None:
        self.keys = [None] * self.num_layers
        self.values = [None] * self.num_layers

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cached_k, cached_v = self.keys[layer_idx], self.values[layer_idx]
        if cached_k is not None and cached_v is not None:
            k = torch.cat([cached_k, k], dim=0)
            v = torch.cat([cached_v, v], dim=0)
        self.keys[layer_idx], self.values[layer_idx] = k, v
        return causal_attention(q, k, v)
