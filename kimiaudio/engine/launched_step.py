"""What a step sampled: read at once, or still on the device behind the next step.

A step that samples on the device (graph_sampling.py) can be launched before the previous
one's samples are read: the next step's ids are taken from them on the device
(decode_batch.py), and the host reads them meanwhile. A `LaunchedStep` holds such a step: its
sequences in batch order (every one samples), its samples on the device (what the next step
reads) and their copy to the host, queued on the stream right after the step, so `read` waits
for this step only and not for the one launched after it (audio/device_result.py's HostCopy).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kimiaudio.audio.device_result import DeviceResult, HostCopy
from kimiaudio.engine.sequence import Sequence


class StepSample(NamedTuple):
    """One sequence's samples of a step."""

    text: int
    audio: int
    text_logprob: float  # of the text token, from the sampler's distribution (sampler.py)
    text_top: tuple[tuple[int, float], ...] | None  # the likeliest text tokens, when asked for


def read_samples(samples: torch.Tensor, rows: list[int]) -> list[StepSample]:
    """Samples float64 [2, 2 * Bp] (tokens: text rows, then audio rows; log-probabilities)
    -> those of `rows`; on a device tensor, the step's one host-device synchronisation."""
    tokens, logprobs = samples.tolist()
    padded = len(tokens) // 2
    return [StepSample(int(tokens[row]), int(tokens[padded + row]), logprobs[row], None) for row in rows]


class LaunchedStep:
    def __init__(self, seqs: list[Sequence], samples: torch.Tensor):
        """Called right after the step is queued: the host copy follows it on the stream."""
        self.seqs = seqs
        self.samples = samples
        self._rows = {seq.seq_id: row for row, seq in enumerate(seqs)}
        rows = list(range(len(seqs)))
        self._host = HostCopy(DeviceResult([samples], lambda host: read_samples(host[0], rows)))

    def row_of(self, seq: Sequence) -> int | None:
        """seq's row in this step's batch (None: not in it)."""
        return self._rows.get(seq.seq_id)

    def read(self) -> list[StepSample]:
        """Every sequence's samples, in batch order (waits for this step if it has not ended)."""
        return self._host.value()
