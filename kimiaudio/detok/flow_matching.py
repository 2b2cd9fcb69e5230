"""Flow-matching inference of mel chunks: the Euler ODE over the DiT, batched across streams.

Follows the official StreamingSemanticFMWrapper.infer_chunk with the torchdyn 1.0.6 Euler solver
(NeuralODE(solver="euler")): t_span = linspace(0, 1, steps) in fp32, steps-1 Euler steps,
t accumulated in fp32 (t += dt, then dt = t_span[k+1] - t), the DiT gets (t*1000).long().
After a chunk with look-ahead, one more DiT call at t=0.999 on the kept (clean) frames gives the
K/V that later chunks attend to; without look-ahead, the K/V of the last Euler call are kept.

Batching: jobs with the same step count run together, at most max_batch_sessions at a time,
padded to a bucket shape (detok/buckets.py) in static buffers (detok/dit_batch.py); the refresh
is one more call of the same bucket with the look-ahead keys masked and dt = 0. `run_step` runs
one call of a loaded bucket: eagerly, or by replaying its CUDA graph (detok/dit_vocoder_graphs.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from kimiaudio.detok.buckets import Buckets
from kimiaudio.detok.dit_batch import DiTBatch, StaticArena
from kimiaudio.models.dit import DiTPrefix

REFRESH_T = 0.999  # official t of the KV-cache refresh call


def euler_schedule(steps: int) -> tuple[Tensor, Tensor]:
    """fp32 (t [steps-1], dt [steps-1]) of torchdyn's fixed-step loop over linspace(0, 1, steps)."""
    t_span = torch.linspace(0, 1, steps)
    t, dt = t_span[0], t_span[1] - t_span[0]
    ts, dts = [], []
    for k in range(1, steps):
        ts.append(t)
        dts.append(dt)
        t = t + dt
        if k < steps - 1:
            dt = t_span[k + 1] - t
    return torch.stack(ts), torch.stack(dts)


def timestep_ids(t: Tensor) -> Tensor:
    """What the official ODE wrapper hands the DiT: (t * 1000).long() on fp32 t."""
    return (t.float() * 1000).long()


@functools.cache
def euler_steps(steps: int) -> tuple[tuple[int, float], ...]:
    """(timestep id, dt) of each Euler call of a `steps`-point grid, as host numbers: built once
    per step count, not per batch."""
    t, dt = euler_schedule(steps)
    return tuple(zip(timestep_ids(t).tolist(), dt.tolist()))


@dataclass
class ChunkJob:
    """One stream's chunk as the DiT sees it."""

    token_ids: Tensor  # [n] long (CPU): upsampled semantic ids incl. the carried look-ahead frames
    noise: Tensor  # [n, mel_bins] fp32 (CPU) initial x0
    start_position: int  # absolute position of the first frame
    prefix_kv: Tensor | None  # [depth, 2, heads, p, head_dim] cached K/V of earlier chunks
    look_ahead: int  # trailing frames to drop (0 for a final chunk)
    keep_kv: bool  # False when the stream's DiT state is discarded after this chunk
    ode_steps: int = 30  # points of the Euler grid linspace(0, 1, ode_steps)

    @property
    def prefix_frames(self) -> int:
        return 0 if self.prefix_kv is None else self.prefix_kv.shape[3]


@dataclass
class ChunkOutput:
    mel: Tensor  # [n - look_ahead, mel_bins] (de-normalised if the checkpoint says so)
    kv: Tensor | None  # [depth, 2, heads, n - look_ahead, head_dim] K/V of the kept frames


class FlowMatcher:
    def __init__(self, dit: DiTPrefix, buckets: Buckets, run_step: Callable[[DiTBatch], None] | None = None):
        self.dit, self.buckets = dit, buckets
        self.run_step = run_step or DiTBatch.step
        self.arena = StaticArena(dit.input_linear.weight.device)
        self._batches: dict = {}
        self.num_calls = 0  # DiT calls (batched) so far
        self.num_prefill_calls = 0  # DiT calls over voice prompts (detok/voice_prefix.py)
        self.batch(buckets.max_shape)  # the arena at its planned size before any graph takes views

    def batch(self, shape) -> DiTBatch:
        """The static buffers of a bucket (kept for bucketed shapes: graphs hold on to them)."""
        if self.buckets.exact:
            return DiTBatch(self.dit, shape, self.arena)
        if shape not in self._batches:
            self._batches[shape] = DiTBatch(self.dit, shape, self.arena)
        return self._batches[shape]

    @torch.inference_mode()
    def infer_chunks(self, jobs: list[ChunkJob]) -> list[ChunkOutput]:
        """Run the ODE for every job: one batch per step count (split at the largest bucket);
        results equal running each job alone."""
        outputs: dict[int, ChunkOutput] = {}
        limit = self.buckets.batch_sizes[-1]
        for steps in sorted({job.ode_steps for job in jobs}):
            rows = [i for i, job in enumerate(jobs) if job.ode_steps == steps]
            for start in range(0, len(rows), limit):
                group = rows[start : start + limit]
                for i, out in zip(group, self._infer_group([jobs[i] for i in group], steps)):
                    outputs[i] = out
        return [outputs[i] for i in range(len(jobs))]

    def _infer_group(self, jobs: list[ChunkJob], steps: int) -> list[ChunkOutput]:
        mel_bins, dev = self.dit.cfg.input_size, self.arena.device
        dtype = self.dit.input_linear.weight.dtype
        # a final chunk with no frames left (no look-ahead carried) has nothing for the DiT to do
        outputs = [ChunkOutput(torch.zeros(0, mel_bins, device=dev, dtype=dtype), None) for _ in jobs]
        live = [i for i, job in enumerate(jobs) if job.token_ids.numel() > 0]
        if not live:
            return outputs
        todo = [jobs[i] for i in live]
        shape = self.buckets.shape(
            len(todo), max(j.token_ids.numel() for j in todo), max(j.prefix_frames for j in todo)
        )
        batch = self.batch(shape)
        batch.load(todo)
        schedule = euler_steps(steps)
        for t_id, dt in schedule:
            batch.set_time(t_id, dt)
            self.run_step(batch)
        self.num_calls += len(schedule)
        kept = [job.token_ids.numel() - job.look_ahead for job in todo]
        mels = [batch.mel(j, k) for j, k in enumerate(kept)]
        kvs: list[Tensor | None] = [None] * len(todo)
        for j, job in enumerate(todo):  # no look-ahead: the last Euler call's K/V are the cache
            if job.keep_kv and job.look_ahead == 0:
                kvs[j] = batch.chunk_kv(j, kept[j])
        refresh = [j for j, job in enumerate(todo) if job.keep_kv and job.look_ahead > 0]
        if refresh:  # the official extra call at t=0.999 on the kept (clean) frames; dt = 0 keeps x
            batch.restrict_keys(refresh, [kept[j] for j in refresh])
            batch.set_time(REFRESH_ID, 0.0)
            self.run_step(batch)
            self.num_calls += 1
            for j in refresh:
                kvs[j] = batch.chunk_kv(j, kept[j])
        for j, i in enumerate(live):
            outputs[i] = ChunkOutput(self._denormalise(mels[j]), kvs[j])
        return outputs

    @torch.inference_mode()
    def prefill_chunk(self, token_ids: Tensor, mel: Tensor, start_position: int, prefix_kv: Tensor | None) -> Tensor:
        """The official prefill_chunk: one DiT call at t = 0.999 on a clean (reference) mel
        [n, mel_bins] over `prefix_kv`; returns the chunk's K/V [depth, 2, heads, n, head_dim].
        Runs eagerly: prompts come once per voice, in shapes no graph was captured for."""
        cfg, dtype = self.dit.cfg, self.dit.input_linear.weight.dtype
        x = mel.to(self.arena.device, dtype)
        stats = cfg.mel_stats()
        if stats is not None:  # as the official: cast first, normalise in the DiT's dtype
            mean, std = stats
            x = (x - mean) / std
        job = ChunkJob(token_ids, x.float().cpu(), start_position, prefix_kv, 0, True)
        batch = self.batch(self.buckets.shape(1, job.token_ids.numel(), job.prefix_frames))
        batch.load([job])
        batch.set_time(REFRESH_ID, 0.0)
        batch.step()
        self.num_prefill_calls += 1
        return batch.chunk_kv(0, job.token_ids.numel())

    def _denormalise(self, mel: Tensor) -> Tensor:
        stats = self.dit.cfg.mel_stats()
        if stats is None:
            return mel
        mean, std = stats
        return mel * std + mean


REFRESH_ID = int(timestep_ids(torch.tensor([REFRESH_T])).item())  # 999
