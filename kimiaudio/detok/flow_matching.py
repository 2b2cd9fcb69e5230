"""Flow-matching inference of mel chunks: the Euler ODE over the DiT, batched across sessions.

Follows the official StreamingSemanticFMWrapper.infer_chunk with the torchdyn 1.0.6 Euler solver
(NeuralODE(solver="euler")): t_span = linspace(0, 1, steps) in fp32, steps-1 Euler steps,
t accumulated in fp32 (t += dt, then dt = t_span[k+1] - t), the DiT gets (t*1000).long().
After a chunk with look-ahead, one more DiT call at t=0.999 on the kept (clean) frames gives the
K/V that later chunks attend to; without look-ahead, the K/V of the last Euler call are kept.
Several sessions' chunks run in one padded forward per step (see DiTPrefix.prepare).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

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


@dataclass
class ChunkJob:
    """One session's chunk as the DiT sees it."""

    token_ids: Tensor  # [n] long: upsampled semantic ids incl. the carried look-ahead frames
    noise: Tensor  # [n, mel_bins] fp32 initial x0
    start_position: int  # absolute position of the first frame
    prefix_kv: Tensor | None  # [depth, 2, p, heads, head_dim] cached K/V of earlier chunks
    look_ahead: int  # trailing frames to drop (0 for a final chunk)
    keep_kv: bool  # False when the session's DiT state is discarded after this chunk
    ode_steps: int = 30  # points of the Euler grid linspace(0, 1, ode_steps)


@dataclass
class ChunkOutput:
    mel: Tensor  # [n - look_ahead, mel_bins] (de-normalised if the checkpoint says so)
    kv: Tensor | None  # [depth, 2, n - look_ahead, heads, head_dim] K/V of the kept frames


class FlowMatcher:
    def __init__(self, dit: DiTPrefix):
        self.dit = dit
        self._schedules: dict[int, tuple[list[Tensor], list[Tensor]]] = {}
        self._refresh_id = timestep_ids(torch.tensor([REFRESH_T])).to(dit.input_linear.weight.device)

    def schedule(self, steps: int) -> tuple[list[Tensor], list[Tensor]]:
        """Per Euler call: [1] timestep ids and 0-dim fp32 dt on the device, as torchdyn hands them over."""
        if steps not in self._schedules:
            dev = self.dit.input_linear.weight.device
            t, dt = euler_schedule(steps)
            self._schedules[steps] = ([tid.view(1).to(dev) for tid in timestep_ids(t)], [d.to(dev) for d in dt])
        return self._schedules[steps]

    @torch.inference_mode()
    def infer_chunks(self, jobs: list[ChunkJob]) -> list[ChunkOutput]:
        """Run the ODE for every job, one batch per step count; results equal running each job alone."""
        outputs: list[ChunkOutput | None] = [None] * len(jobs)
        for steps in sorted({job.ode_steps for job in jobs}):
            rows = [i for i, job in enumerate(jobs) if job.ode_steps == steps]
            for i, out in zip(rows, self._infer_group([jobs[i] for i in rows], steps)):
                outputs[i] = out
        return outputs

    def _infer_group(self, jobs: list[ChunkJob], steps: int) -> list[ChunkOutput]:
        dtype = self.dit.input_linear.weight.dtype
        dev = self.dit.input_linear.weight.device
        mel_bins = self.dit.cfg.input_size
        # a final chunk with no frames left (no look-ahead carried) has nothing for the DiT to do
        outputs = [ChunkOutput(torch.zeros(0, mel_bins, device=dev, dtype=dtype), None) for _ in jobs]
        live = [i for i, job in enumerate(jobs) if job.token_ids.numel() > 0]
        if not live:
            return outputs
        batch = [jobs[i] for i in live]
        lengths = [job.token_ids.numel() for job in batch]
        ctx, x = self._batch_inputs(batch, lengths, dtype, dev)
        want_last_kv = any(job.keep_kv and job.look_ahead == 0 for job in batch)
        last_kv = None
        t_ids, dts = self.schedule(steps)
        for step, (t_id, dt) in enumerate(zip(t_ids, dts)):
            last = step == len(dts) - 1
            if last and want_last_kv:
                v, last_kv = self.dit(x, t_id, ctx, return_kv=True)
            else:
                v = self.dit(x, t_id, ctx)
            x = x + dt * v
        del ctx
        kept = [n - job.look_ahead for n, job in zip(lengths, batch)]
        refresh = [j for j, job in enumerate(batch) if job.keep_kv and job.look_ahead > 0]
        refresh_kv = self._refresh(batch, x, kept, refresh, dtype, dev) if refresh else None
        for j, i in enumerate(live):
            job, mel = batch[j], x[j, : kept[j]]
            kv = None
            if job.keep_kv and job.look_ahead > 0:
                kv = refresh_kv[:, :, refresh.index(j), : kept[j]]
            elif job.keep_kv:
                kv = last_kv[:, :, j, : kept[j]]
            outputs[i] = ChunkOutput(self._denormalise(mel), kv)
        return outputs

    def _refresh(self, batch, x, kept, rows, dtype, dev) -> Tensor:
        """One DiT call at t=0.999 on the kept frames of `rows`: their K/V [depth, 2, R, N, ...]."""
        sub = [batch[j] for j in rows]
        lengths = [kept[j] for j in rows]
        ctx, _ = self._batch_inputs(sub, lengths, dtype, dev, with_noise=False)
        clean = x[rows, : max(lengths)]
        _, kv = self.dit(clean, self._refresh_id, ctx, return_kv=True)
        return kv

    def _batch_inputs(self, jobs, lengths, dtype, dev, with_noise=True):
        """Pad ids/positions/noise to the longest job: (ctx, x0 [B, N, mel_bins] or None)."""
        b, n = len(jobs), max(lengths)
        lens = torch.tensor(lengths, device=dev)
        frame_valid = torch.arange(n, device=dev)[None] < lens[:, None]  # [B, N]
        ids = torch.zeros(b, n, dtype=torch.long, device=dev)
        starts = torch.tensor([job.start_position for job in jobs], device=dev)
        positions = (starts[:, None] + torch.arange(n, device=dev)[None]) * frame_valid  # padding -> 0
        x = None
        if with_noise:
            x = torch.zeros(b, n, self.dit.cfg.input_size, dtype=dtype, device=dev)
        for i, (job, m) in enumerate(zip(jobs, lengths)):
            ids[i, :m] = job.token_ids[:m]
            if with_noise:
                x[i, :m] = job.noise.to(device=dev, dtype=dtype)
        ctx = self.dit.prepare(ids, positions, frame_valid, [job.prefix_kv for job in jobs])
        return ctx, x

    def _denormalise(self, mel: Tensor) -> Tensor:
        cfg = self.dit.cfg
        return mel * cfg.mel_std + cfg.mel_mean if cfg.normalize_mel else mel
