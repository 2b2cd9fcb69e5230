"""Vocoding many streams' mels: one BigVGAN forward per group of equal mel lengths.

Every conv and anti-aliasing filter pads its own input at the edges (zeros, or replicate), so
padding a mel in time changes the samples near its end: only mels of the same length may share
a forward. Rows are independent, so a group pads only the batch dimension, to a batch bucket
(when `padded`, i.e. for CUDA graphs: one captured graph per (length, rows) pair, see
detok/dit_vocoder_graphs.py); the CPU runs each group at its own size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kimiaudio.models.bigvgan import BigVGAN


def eager_forward(vocoder: BigVGAN) -> Callable[[Tensor], Tensor]:
    """mel [B, num_mels, T] -> wav [B, T * hop], a plain call."""
    return lambda mel: vocoder(mel)[:, 0]


class VocoderBatcher:
    def __init__(
        self,
        vocoder: BigVGAN,
        batch_sizes: tuple[int, ...],
        padded: bool,
        forward: Callable[[Tensor], Tensor] | None = None,
    ):
        self.batch_sizes, self.padded = batch_sizes, padded
        self.forward = forward or eager_forward(vocoder)

    def rows(self, n: int) -> int:
        """The batch a group of n equal-length mels runs at (n <= the largest batch size)."""
        if not self.padded:
            return n
        return next(size for size in self.batch_sizes if size >= n)

    def vocode(self, mels: list[Tensor]) -> list[Tensor]:
        """[frames, mel_bins] each -> wav [frames * hop] each."""
        wavs: dict[int, Tensor] = {}
        groups: dict[int, list[int]] = {}
        for i, mel in enumerate(mels):
            groups.setdefault(mel.shape[0], []).append(i)
        limit = self.batch_sizes[-1]
        for length, members in groups.items():
            if length == 0:
                for i in members:
                    wavs[i] = mels[i].new_zeros(0)
                continue
            for start in range(0, len(members), limit):
                rows = members[start : start + limit]
                batch = torch.stack([mels[i] for i in rows])  # [n, T, mel_bins]
                if self.rows(len(rows)) > len(rows):  # padded rows: zeros, results dropped
                    pad = batch.new_zeros(self.rows(len(rows)) - len(rows), *batch.shape[1:])
                    batch = torch.cat([batch, pad])
                out = self.forward(batch.transpose(1, 2))  # [B, T * hop]
                for j, i in enumerate(rows):
                    wavs[i] = out[j]
        return [wavs[i] for i in range(len(mels))]
