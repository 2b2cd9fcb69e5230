"""Static input buffers of one DiT bucket: B rows of N frames over a cached prefix of P frames.

`load` copies a group of chunk jobs in (eagerly, once per chunk): noise x0, the semantic-token
condition, positions (RoPE factors / position embedding), each stream's prefix K/V and the key
mask; `step` is one Euler step `x += dt * v(t, x)` that reads and writes only these buffers,
which is what a CUDA graph captures (detok/dit_vocoder_graphs.py) and what the CPU runs eagerly.
Masking makes padding exact: a padded key (prefix beyond a stream's own, frames beyond its
chunk) gets zero attention weight, a padded frame's output is dropped, and a padded row only
computes garbage nobody reads. Rows never have every key masked (no NaN anywhere), and every
buffer is zero-initialised, so masked keys always hold finite values.

All buckets take their buffers from one StaticArena: views at offset 0 of flat buffers sized
for the largest bucket, so buckets (and their graphs) share the memory; only one runs at a time.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kimiaudio.detok.buckets import BucketShape
from kimiaudio.errors import KimiAudioError
from kimiaudio.models.dit import DiTContext, DiTPrefix


class StaticArena:
    """One flat zero-initialised buffer per role; `view` hands out [shape] views at offset 0.
    A view larger than its role's buffer gets a new, bigger buffer: older views keep the old
    storage alive and stay valid (they only stop sharing memory)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._flat: dict[str, Tensor] = {}

    def view(self, role: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        numel = 1
        for size in shape:
            numel *= size
        flat = self._flat.get(role)
        if flat is None or flat.numel() < numel or flat.dtype != dtype:
            flat = torch.zeros(max(numel, 1), dtype=dtype, device=self.device)
            self._flat[role] = flat
        return flat[:numel].view(shape)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._flat.values())


class DiTBatch:
    def __init__(self, dit: DiTPrefix, shape: BucketShape, arena: StaticArena):
        self.dit, self.shape = dit, shape
        cfg, dtype = dit.cfg, dit.input_linear.weight.dtype
        b, n, p = shape.rows, shape.frames, shape.prefix
        heads, head_dim = dit.kv_shape
        self.x = arena.view("x", (b, n, cfg.input_size), dtype)  # the ODE state, updated in place
        self.cond = arena.view("cond", (b, n, cfg.hidden_size), dtype)
        self.pos_emb = None
        if cfg.position_embedding_type != "skip":
            self.pos_emb = arena.view("pos_emb", (b, n, cfg.hidden_size), dtype)
        self.rope = arena.view("rope", (b, n, 1, head_dim // 2), torch.complex64) if cfg.use_rope else None
        self.mask = arena.view("mask", (b, 1, 1, p + n), torch.bool)
        self.t = arena.view("t", (b,), torch.long)  # timestep ids (t * 1000)
        self.dt = arena.view("dt", (b, 1, 1), dtype)  # as torchdyn: fp32 dt rounded to x's dtype
        # [depth, 2 (k, v), B, heads, P + N, head_dim]: the prefix in [:P], the chunk in [P:]
        self.kv = arena.view("kv", (cfg.depth, 2, b, heads, p + n, head_dim), dtype)
        self.ctx = DiTContext(
            self.cond, self.pos_emb, self.rope, list(self.kv[:, 0]), list(self.kv[:, 1]), p, self.mask
        )
        self._keys: Tensor | None = None  # [B, P + N] bool on the CPU: the real keys of the loaded jobs

    def load(self, jobs: list) -> None:
        """Copy ChunkJobs (at most B, each with at most N frames and P prefix frames) in."""
        b, n, p = self.shape.rows, self.shape.frames, self.shape.prefix
        ids = torch.zeros(b, n, dtype=torch.long)
        positions = torch.zeros(b, n, dtype=torch.long)  # padding frames: position 0 (any valid row)
        noise = torch.zeros(b, n, self.x.shape[-1])
        keys = torch.zeros(b, p + n, dtype=torch.bool)
        keys[len(jobs) :] = True  # padded rows: all keys, so no row is fully masked
        for i, job in enumerate(jobs):
            m, prefix = job.token_ids.numel(), job.prefix_frames
            ids[i, :m] = job.token_ids
            positions[i, :m] = torch.arange(job.start_position, job.start_position + m)
            noise[i, :m] = job.noise
            keys[i, :prefix] = True
            keys[i, p : p + m] = True
        dev = self.x.device
        ids, positions = ids.to(dev), positions.to(dev)
        self.x.copy_(noise)  # fp32 noise -> x's dtype, as the official .to(dtype)
        self.cond.copy_(self.dit.semantic_token_embedding(ids))
        pos_emb, rope = self.dit.position_inputs(positions)
        for buffer, value in ((self.pos_emb, pos_emb), (self.rope, rope)):
            if value is not None:
                if buffer is None:
                    raise KimiAudioError("DiTBatch: the DiT gives a position input this batch has no buffer for")
                buffer.copy_(value)
        self._keys = keys
        self.mask.copy_(keys[:, None, None, :])
        for i, job in enumerate(jobs):
            if job.prefix_kv is not None:
                self.kv[:, :, i, :, : job.prefix_frames] = job.prefix_kv  # [depth, 2, heads, p_i, head_dim]

    def set_time(self, t_id: int, dt: float) -> None:
        self.t.fill_(t_id)
        self.dt.fill_(dt)

    def step(self) -> None:
        """One Euler step of every row: x <- x + dt * v(t, x). Also leaves the call's chunk K/V
        in self.kv[..., P:, :]. Reads and writes only this batch's buffers (graph-capturable)."""
        v = self.dit(self.x, self.t, self.ctx)
        self.x.add_(self.dt * v)

    def restrict_keys(self, rows: list[int], kept: list[int]) -> None:
        """For the K/V refresh call: rows[j] attends only to its first kept[j] chunk frames (and
        its prefix), as the official refresh runs the DiT on the kept frames alone."""
        if self._keys is None:
            raise KimiAudioError("restrict_keys: the batch has no jobs loaded")
        keys = self._keys.clone()
        p = self.shape.prefix
        for row, k in zip(rows, kept):
            keys[row, p + k :] = False
        self.mask.copy_(keys[:, None, None, :])

    def mel(self, row: int, frames: int) -> Tensor:
        """[frames, mel_bins]: a copy (the buffers are shared with every other bucket)."""
        return self.x[row, :frames].clone()

    def chunk_kv(self, row: int, frames: int) -> Tensor:
        """[depth, 2, heads, frames, head_dim] of the last call's first `frames` chunk frames (a copy)."""
        p = self.shape.prefix
        return self.kv[:, :, row, :, p : p + frames].clone()
