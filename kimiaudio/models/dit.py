"""The detokenizer's flow-matching DiT (`audio_detokenizer/config.yaml` + `model.pt`).

Follows the official DiTPrefix (kimia_infer/models/detokenizer/flow_matching/model.py and
dit_block.py): semantic-token embedding as the condition, adaLN-Zero blocks, non-causal
attention over a cached prefix (post-RoPE K/V of earlier chunks) plus the current chunk,
interleaved complex RoPE by absolute position. Unlike the official batch-1 varlen call, a
forward takes a padded batch of sessions: `prepare` builds, once per chunk, the per-session
condition, positions and prefix K/V with a key mask, so padding never changes any result.
Attribute names are the checkpoint's tensor names (after stripping "speech_model.").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kimiaudio.checkpoint.files import config_value, load_into, load_torch_file, read_yaml
from kimiaudio.errors import CheckpointError

POSITION_EMBEDDINGS = ("skip", "sincos", "learnable")


@dataclass(frozen=True)
class DiTConfig:
    """The keys of audio_detokenizer/config.yaml that the official loader reads."""

    input_size: int  # mel bins
    semantic_vocab_size: int  # codebook size; the embedding has one more (CFG null) row
    hidden_size: int
    depth: int
    num_heads: int
    mlp_ratio: float
    use_rope: bool
    rope_max_positions: int
    rope_base: float
    rope_interpolation_factor: float
    position_embedding_type: str
    max_seq_len: int
    normalize_mel: bool
    mel_mean: float | None
    mel_std: float | None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_yaml(cls, path: Path) -> "DiTConfig":
        raw = read_yaml(path)
        dit = config_value(raw, "model", path)
        dit = config_value(dit, "dit", path) if isinstance(dit, dict) else None
        if not isinstance(dit, dict):
            raise CheckpointError(f"{path}: expected a mapping under 'model.dit'")

        def get(key, kind, default=...):
            value = config_value(dit, key, path, default)
            accepted = (int, float) if kind is float else kind
            if isinstance(value, bool) != (kind is bool) or not isinstance(value, accepted) or (kind is int and value <= 0):
                raise CheckpointError(f"{path}: 'model.dit.{key}' = {value!r}, expected a {'positive ' * (kind is int)}{kind.__name__}")
            return kind(value)

        ffn = config_value(dit, "ffn_type", path, "conv1d_conv1d")  # official default
        if ffn != "vanilla_mlp":
            raise CheckpointError(f"{path}: 'model.dit.ffn_type' = {ffn!r}, only 'vanilla_mlp' is supported")
        kind = config_value(dit, "position_embedding_type", path)
        if kind not in POSITION_EMBEDDINGS:
            raise CheckpointError(f"{path}: 'model.dit.position_embedding_type' = {kind!r}, expected one of {POSITION_EMBEDDINGS}")
        rope = config_value(dit, "rope_params", path, {})
        if not isinstance(rope, dict):
            raise CheckpointError(f"{path}: 'model.dit.rope_params' must be a mapping")
        normalize = config_value(raw, "normalize_mel", path)
        mean, std = config_value(raw, "mel_mean", path, None), config_value(raw, "mel_std", path, None)
        if normalize and not all(isinstance(v, (int, float)) for v in (mean, std)):
            raise CheckpointError(f"{path}: normalize_mel is true but mel_mean/mel_std are not numbers")
        cfg = cls(
            input_size=get("input_size", int),
            semantic_vocab_size=get("semantic_vocab_size", int),
            hidden_size=get("hidden_size", int),
            depth=get("depth", int),
            num_heads=get("num_heads", int),
            mlp_ratio=get("mlp_ratio", float, 4.0),
            use_rope=get("use_rope", bool, False),
            rope_max_positions=int(rope.get("max_position_embeddings", 4096)),
            rope_base=float(rope.get("rope_base", 10000.0)),
            rope_interpolation_factor=float(rope.get("rope_interpolation_factor", 1.0)),
            position_embedding_type=kind,
            max_seq_len=get("max_seq_len", int),
            normalize_mel=bool(normalize),
            mel_mean=float(mean) if normalize else None,
            mel_std=float(std) if normalize else None,
        )
        if cfg.hidden_size % cfg.num_heads or cfg.head_dim % 2:
            raise CheckpointError(f"{path}: hidden_size {cfg.hidden_size} must split into {cfg.num_heads} heads of even size")
        return cfg


def rope_table(cfg: DiTConfig) -> Tensor:
    """complex64 [rows, head_dim/2]: polar(1, pos/interp * base^(-2i/head_dim)) (official table)."""
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_base ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    pos = torch.arange(cfg.rope_max_positions).float() * (1.0 / float(cfg.rope_interpolation_factor))
    freqs = torch.outer(pos, inv).float()
    table = torch.polar(torch.ones_like(freqs), freqs)
    return table[: cfg.max_seq_len] if cfg.max_seq_len < cfg.rope_max_positions else table


def sincos_table(rows: int, dim: int) -> Tensor:
    """fp32 [rows, dim] fairseq sinusoidal table ([sin | cos], row 0 = padding = zeros)."""
    half = dim // 2
    scale = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.float) * -scale)
    args = torch.arange(rows, dtype=torch.float).unsqueeze(1) * freqs.unsqueeze(0)
    table = torch.cat([torch.sin(args), torch.cos(args)], dim=1).view(rows, -1)
    if dim % 2 == 1:
        table = torch.cat([table, torch.zeros(rows, 1)], dim=1)
    table[0, :] = 0
    return table


@dataclass
class DiTContext:
    """What stays fixed over the ODE of one batch of chunks (B sessions, N padded frames)."""

    cond: Tensor  # [B, N, hidden] semantic-token embedding
    pos_emb: Tensor | None  # [B, N, hidden] (sincos / learnable position embedding)
    rope: Tensor | None  # [B, N, 1, head_dim/2] complex64
    k_bufs: list[Tensor]  # per block [B, heads, P+N, head_dim]: prefix in [:P], chunk written in [P:]
    v_bufs: list[Tensor]
    prefix_len: int  # P
    attn_mask: Tensor | None  # [B, 1, 1, P+N] bool, True = a real key; None when nothing is padded


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
        return self.mlp(emb.to(self.mlp[0].weight.dtype))


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: Tensor, ctx: DiTContext, idx: int) -> tuple[Tensor, Tensor, Tensor]:
        b, n, h = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).unbind(2)  # [B, N, heads, hd]
        if ctx.rope is not None:
            q, k = _apply_rope(q, ctx.rope), _apply_rope(k, ctx.rope)
        k_all, v_all = ctx.k_bufs[idx], ctx.v_bufs[idx]  # [B, heads, P+N, hd]
        k_all[:, :, ctx.prefix_len :] = k.transpose(1, 2)
        v_all[:, :, ctx.prefix_len :] = v.transpose(1, 2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k_all, v_all, attn_mask=ctx.attn_mask)
        return self.proj(out.transpose(1, 2).reshape(b, n, h)), k, v


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

    def forward(self, x: Tensor, c: Tensor, ctx: DiTContext, idx: int) -> tuple[Tensor, Tensor, Tensor]:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=2)
        h = x.shape[-1]
        a, k, v = self.attn(_modulate(F.layer_norm(x, (h,), eps=1e-6), shift1, scale1), ctx, idx)
        x = x + gate1 * a
        x = x + gate2 * self.mlp(_modulate(F.layer_norm(x, (h,), eps=1e-6), shift2, scale2))
        return x, k, v


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
        h = cfg.hidden_size
        self.t_embedder = TimestepEmbedder(h)
        self.semantic_token_embedding = nn.Embedding(cfg.semantic_vocab_size + 1, h)  # +1: CFG null row
        self.input_linear = nn.Linear(cfg.input_size, h)
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

    def prepare(
        self, cond_ids: Tensor, position_ids: Tensor, frame_valid: Tensor, prefix: list[Tensor | None]
    ) -> DiTContext:
        """cond_ids/position_ids [B, N] long, frame_valid [B, N] bool (False = padding),
        prefix: per session None or its cached K/V [depth, 2, p, heads, head_dim]."""
        b, n = cond_ids.shape
        dev, dtype = cond_ids.device, self.input_linear.weight.dtype
        cond = self.semantic_token_embedding(cond_ids)
        pos_emb = self._position_embedding(position_ids, dtype)
        rope = None
        if self._rope is not None:
            if self._rope.device != dev:
                self._rope = self._rope.to(dev)
            rope = self._rope[position_ids].unsqueeze(2)
        lens = [0 if kv is None else kv.shape[2] for kv in prefix]
        p = max(lens)
        heads, hd = self.kv_shape
        kbuf = torch.zeros(self.cfg.depth, 2, b, heads, p + n, hd, device=dev, dtype=dtype)
        for i, kv in enumerate(prefix):
            if kv is not None:
                kbuf[:, :, i, :, : kv.shape[2]] = kv.transpose(2, 3)
        mask = None
        if len(set(lens)) > 1 or not bool(frame_valid.all()):
            prefix_valid = torch.arange(p, device=dev)[None] < torch.tensor(lens, device=dev)[:, None]
            mask = torch.cat([prefix_valid, frame_valid], dim=1)[:, None, None, :]
        return DiTContext(cond, pos_emb, rope, list(kbuf[:, 0]), list(kbuf[:, 1]), p, mask)

    def _position_embedding(self, position_ids: Tensor, dtype: torch.dtype) -> Tensor | None:
        kind = self.cfg.position_embedding_type
        if kind == "learnable":
            return self.position_embedding(position_ids)
        if kind != "sincos":
            return None
        # fairseq make_positions with padding_idx 0: chunk-relative 1..n, position id 0 -> zero row
        nonzero = position_ids.ne(0).long()
        positions = torch.cumsum(nonzero, dim=1) * nonzero
        rows = int(positions.max()) + 1
        if self._sincos.shape[0] < rows:
            self._sincos = sincos_table(rows, self.cfg.hidden_size)
        if self._sincos.device != position_ids.device:
            self._sincos = self._sincos.to(position_ids.device)
        return self._sincos.to(dtype)[positions]

    def forward(self, x: Tensor, t: Tensor, ctx: DiTContext, return_kv: bool = False):
        """x [B, N, input_size], t [B] or [1] long timestep (t*1000) -> velocity [B, N, input_size];
        with return_kv also the chunk's post-RoPE K/V [depth, 2, B, N, heads, head_dim]."""
        x = self.input_linear(x)
        if ctx.pos_emb is not None:
            x = x + ctx.pos_emb
        c = self.t_embedder(t).unsqueeze(1) + ctx.cond  # [B, N, hidden]
        kvs = []
        for idx, block in enumerate(self.blocks):
            x, k, v = block(x, c, ctx, idx)
            if return_kv:
                kvs.append(torch.stack([k, v]))
        out = self.final_layer(x, c)
        return (out, torch.stack(kvs)) if return_kv else out


class _SinCosHolder(nn.Module):
    """Holds the official SinusoidalPositionalEmbedding's persistent `_float_tensor` buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("_float_tensor", torch.zeros(1))


def load_dit(directory: Path, device: torch.device, dtype: torch.dtype) -> DiTPrefix:
    """config.yaml + model.pt["state_dict"] (keys containing "speech_model", prefix stripped)."""
    directory = Path(directory)
    cfg = DiTConfig.from_yaml(directory / "config.yaml")
    weights = directory / "model.pt"
    state = load_torch_file(weights, "state_dict")
    state = {k.replace("speech_model.", ""): v for k, v in state.items() if "speech_model" in k}
    model = DiTPrefix(cfg)
    load_into(model, state, weights)
    return model.to(device=device, dtype=dtype).eval()
