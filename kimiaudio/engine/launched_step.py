"""What a step sampled: read at once, or still on the device behind the next step.

A step that samples on the device (graph_sampling.py) can be launched before the previous
one's samples are read: the next step's ids are taken from them on the device (`row_ids`
says where, `take_sampled` takes them; decode_batch.py, mixed_batch.py, model_runner.py's
flat batch), and the host reads them meanwhile. A `LaunchedStep` holds such a step: its
sequences in batch order (every one samples), its samples on the device (what the next step
reads) and their copy to the host, queued on the stream right after the step, so `read` waits
for this step only and not for the one launched after it (audio/device_result.py's HostCopy).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kimiaudio.audio.device_result import DeviceResult, HostCopy
from kimiaudio.engine.sequence import Sequence
from kimiaudio.layers.triton_support import use_triton


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


class RowIds(NamedTuple):
    """The ids of one row the host writes: known ones, or the previous launched step's row to
    take the sampled id from on the device (-1: none)."""

    audio: int
    text: int
    use_text: int
    text_from: int = -1
    audio_from: int = -1


def row_ids(seq: Sequence, position: int, previous: LaunchedStep | None) -> RowIds:
    """What the host writes for seq's row at `position`: its ids, or at a position still
    unresolved the row of `previous` that samples them, beside the ids the generation rules
    force whatever is sampled; such a row's use_text is its text id's, as for any generated
    position (Sequence.append_token)."""
    if position < seq.num_tokens - seq.num_unresolved:
        return RowIds(seq.audio_ids[position], seq.text_ids[position], int(seq.use_text[position]))
    row = previous.row_of(seq) if previous is not None else None
    if row is None:
        raise RuntimeError(f"sequence {seq.seq_id}: position {position} unresolved, and no step launched samples it")
    text, audio = seq.rules.forced()  # None: the sampled id is fed back
    audio_id, audio_from = (0, row) if audio is None else (audio, -1)
    if text is None:  # the sampled id, and its use_text, are set on the device
        return RowIds(audio_id, 0, 0, row, audio_from)
    return RowIds(audio_id, text, int(text != 0), -1, audio_from)


def take_sampled(ids: torch.Tensor, sources: torch.Tensor, samples: torch.Tensor) -> None:
    """Rows of a step's inputs take their ids from the previous launched step's samples, on
    the device: ids [3, N] long (audio id, text id, use_text; written in place), sources
    [2, N] long (the row of `samples` to take the text id, then the audio id from; -1: keep),
    samples float64 [2, 2 * Bp] (tokens: text rows, then audio rows; log-probabilities).
    One Triton launch where the kernels run (engine/triton_take_sampled.py), else torch."""
    if use_triton(samples.device):
        from kimiaudio.engine.triton_take_sampled import take_sampled_triton

        take_sampled_triton(ids, sources, samples)
        return
    tokens = samples[0]
    previous_padded = tokens.shape[0] // 2
    for row, source, offset in ((1, sources[0], 0), (0, sources[1], previous_padded)):
        sampled = tokens[source.clamp(min=0) + offset].long()
        ids[row] = torch.where(source >= 0, sampled, ids[row])
    ids[2] = torch.where(sources[0] >= 0, (ids[1] != 0).long(), ids[2])


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
