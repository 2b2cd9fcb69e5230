"""GLM-4-Voice WhisperVQEncoder (the discrete speech tokenizer's network) in PyTorch.

Follows THUDM/GLM-4-Voice speech_tokenizer/modeling_whisper.py as loaded by its
`load_quantize_encoder` (quantize_encoder_only: only the first `quantize_position` layers, no
final LayerNorm): conv1 (k3) -> GELU -> conv2 (k3, stride 2) -> GELU (causal convolutions pad
2 frames on the left only), + embed_positions, pre-LN Whisper layers whose attention is
block-causal (query i sees key j if j <= i or both lie in the same block) and masked to valid
keys; after layer `pooling_position` an avg/max pool over time; after layer
`quantize_position` the nearest codebook row (first minimum of ||c||^2 + ||h||^2 - 2 h.c) and
+ embed_positions2. Attribute names are the checkpoint's tensor names. Only the activation
function comes from transformers (ACT2FN, by the config's name).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kimiaudio.audio.staged_work import Stages, run_to_end
from kimiaudio.checkpoint.files import POSITIVE_INT, checked_value, read_json
from kimiaudio.errors import CheckpointError
from kimiaudio.validation import NO_BOUNDS, Bounds


@dataclass(frozen=True)
class WhisperVQConfig:
    d_model: int
    num_heads: int
    ffn_dim: int
    num_mel_bins: int
    max_source_positions: int
    activation_function: str
    quantize_position: int  # number of layers run (quantize_encoder_only)
    quantize_vocab_size: int
    pooling_kernel_size: int | None
    pooling_type: str
    pooling_position: int | None
    quantize_causal_block_size: int | None
    causal_convolution: bool
    causal_attention: bool  # plain causal layers (encoder_causal_attention or quantize_causal_encoder)

    @classmethod
    def from_file(cls, path: Path) -> WhisperVQConfig:
        from transformers.activations import ACT2FN

        cfg = read_json(path)

        def get(key, expected, bounds=NO_BOUNDS, default=...):
            return checked_value(cfg, key, path, expected, bounds, default)

        def size(key, default=...):
            return get(key, int | None if default is None else int, POSITIVE_INT, default)

        config = cls(
            d_model=size("d_model"),
            num_heads=size("encoder_attention_heads"),
            ffn_dim=size("encoder_ffn_dim"),
            num_mel_bins=size("num_mel_bins"),
            max_source_positions=size("max_source_positions"),
            activation_function=get("activation_function", str, Bounds(choices=tuple(ACT2FN)), "gelu"),
            quantize_position=size("quantize_position"),
            quantize_vocab_size=size("quantize_vocab_size"),
            pooling_kernel_size=size("pooling_kernel_size", None),
            pooling_type=get("pooling_type", str, Bounds(choices=("avg", "max")), "avg"),
            pooling_position=size("pooling_position", None),
            quantize_causal_block_size=size("quantize_causal_block_size", None),
            causal_convolution=get("encoder_causal_convolution", bool, default=False),
            causal_attention=get("encoder_causal_attention", bool, default=False)
            or get("quantize_causal_encoder", bool, default=False),
        )
        if config.d_model % config.num_heads:
            raise CheckpointError(
                f"{path}: d_model {config.d_model} is not a multiple of encoder_attention_heads {config.num_heads}"
            )
        if config.pooling_position is not None and config.pooling_position > config.quantize_position:
            raise CheckpointError(f"{path}: pooling_position must not exceed quantize_position")
        if config.quantize_causal_block_size is not None and config.quantize_causal_block_size < config.pool:
            # the block is counted in pooled frames after pooling: it must keep at least one
            raise CheckpointError(f"{path}: quantize_causal_block_size must be at least pooling_kernel_size")
        return config

    @property
    def pool(self) -> int:
        return self.pooling_kernel_size or 1


class CausalConv1d(nn.Conv1d):
    """Conv1d that pads dilation * (kernel - 1) frames on the left and none on the right."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left = self.dilation[0] * (self.kernel_size[0] - 1)
        return super().forward(F.pad(x, (left, 0)))


class WhisperVQAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        batch, time, d_model = x.shape

        def heads(t):  # [B, T, d] -> [B, H, T, d/H]
            return t.view(batch, time, self.num_heads, -1).transpose(1, 2)

        # mask: additive [B, 1, T, T], or None for a plain causal layer.
        out = F.scaled_dot_product_attention(
            heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)), attn_mask=mask, is_causal=mask is None
        )
        return self.out_proj(out.transpose(1, 2).reshape(batch, time, d_model))


class WhisperVQEncoderLayer(nn.Module):
    def __init__(self, config: WhisperVQConfig):
        super().__init__()
        from transformers.activations import ACT2FN

        self.is_causal = config.causal_attention
        self.self_attn = WhisperVQAttention(config.d_model, config.num_heads)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.fc1 = nn.Linear(config.d_model, config.ffn_dim)
        self.fc2 = nn.Linear(config.ffn_dim, config.d_model)
        self.final_layer_norm = nn.LayerNorm(config.d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # Causal layers ignore the padding mask, as the official SDPA path does.
        x = x + self.self_attn(self.self_attn_layer_norm(x), None if self.is_causal else mask)
        return x + self.fc2(self.activation_fn(self.fc1(self.final_layer_norm(x))))


class WhisperVQEncoder(nn.Module):
    def __init__(self, config: WhisperVQConfig):
        super().__init__()
        self.config = config
        d = config.d_model
        conv = CausalConv1d if config.causal_convolution else nn.Conv1d
        pad = 0 if config.causal_convolution else 1
        self.conv1 = conv(config.num_mel_bins, d, kernel_size=3, padding=pad)
        self.conv2 = conv(d, d, kernel_size=3, stride=2, padding=pad)
        self.embed_positions = nn.Embedding(config.max_source_positions, d)
        self.layers = nn.ModuleList(WhisperVQEncoderLayer(config) for _ in range(config.quantize_position))
        self.codebook = nn.Embedding(config.quantize_vocab_size, d)
        num_pooled = -(-config.max_source_positions // config.pool)
        self.embed_positions2 = nn.Embedding(num_pooled, d)

    @property
    def frame_stride(self) -> int:
        """Mel frames per encoder frame (conv strides)."""
        return self.conv1.stride[0] * self.conv2.stride[0]

    def forward(self, mel: torch.Tensor, mel_mask: torch.Tensor):
        """mel [B, n_mels, T_mel] float32, mel_mask [B, T_mel] bool (True = a real frame).

        Returns (token ids [B, T_tok] long, last_hidden_state [B, T_tok, d], token mask [B, T_tok]);
        T_tok = ceil(T_mel / frame_stride / pool).
        """
        return run_to_end(self.forward_stages(mel, mel_mask))

    def forward_stages(self, mel: torch.Tensor, mel_mask: torch.Tensor) -> Stages[tuple]:
        """`forward` in stages (audio/staged_work.py): pausing before each layer."""
        cfg = self.config
        mask = mel_mask[:, :: self.frame_stride]  # [B, T]
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x)).transpose(1, 2)  # [B, T, d]
        x = x + self.embed_positions.weight[: x.shape[1]]
        block = cfg.quantize_causal_block_size
        attn_mask = self._block_causal_mask(mask, block, x.dtype)
        tokens = None
        for index, layer in enumerate(self.layers, start=1):
            yield
            x = layer(x, attn_mask)
            if index == cfg.pooling_position and cfg.pooling_kernel_size:
                x = self._pool(x)
                mask = mask[:, :: cfg.pool]
                block = block // cfg.pool if block is not None else None
                attn_mask = self._block_causal_mask(mask, block, x.dtype)
            if index == cfg.quantize_position:
                tokens = self._nearest_code(x)  # [B, T]
                x = self.codebook(tokens) + self.embed_positions2.weight[: x.shape[1]]
        return tokens, x, mask

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, d] -> [B, ceil(T / k), d]; the tail is zero-padded to a whole window."""
        k = self.config.pool
        x = x.transpose(1, 2)
        if x.shape[-1] % k:
            x = F.pad(x, (0, k - x.shape[-1] % k))
        pool = F.avg_pool1d if self.config.pooling_type == "avg" else F.max_pool1d
        return pool(x, k).transpose(1, 2)

    def _nearest_code(self, x: torch.Tensor) -> torch.Tensor:
        """Index of the nearest codebook row for each frame (first one on ties): [B, T] long."""
        codebook = self.codebook.weight  # [V, d]
        flat = x.reshape(-1, x.shape[-1])  # [B*T, d]
        base = (codebook**2).sum(dim=1) + (flat**2).sum(dim=1, keepdim=True)  # [B*T, V]
        distances = torch.addmm(base, flat, codebook.t(), alpha=-2.0, beta=1.0)
        return distances.argmin(dim=1).reshape(x.shape[:2])

    @staticmethod
    def _block_causal_mask(mask: torch.Tensor, block: int | None, dtype: torch.dtype) -> torch.Tensor:
        """Additive [B, 1, T, T]: 0 where query i may see key j (causal or same block, key valid)."""
        time = mask.shape[1]
        pos = torch.arange(time, device=mask.device)
        allowed = pos[None, :] <= pos[:, None]  # [T_q, T_k]
        if block is not None:
            allowed = allowed | (pos[None, :] // block == pos[:, None] // block)
        else:  # no block size: the official extended mask is padding-only
            allowed = torch.ones_like(allowed)
        allowed = allowed[None] & mask[:, None, :].bool()  # [B, T_q, T_k]
        additive = torch.zeros(allowed.shape, dtype=dtype, device=mask.device)
        return additive.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]
