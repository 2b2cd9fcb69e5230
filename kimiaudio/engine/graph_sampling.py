"""Sampling inside the decode CUDA graph, for the rows whose settings allow it.

The default settings (text greedy, audio top-k at a temperature, no penalties) need no host
work but the uniforms: each decode graph ends with `sample_greedy_or_top_k` over both heads'
logits, reading each row's top-k (0 = greedy), temperature and uniform from a static buffer
that the runner fills before the replay, and leaves the tokens and their log-probabilities in
one float64 tensor, read back by the step's one `.tolist()` (launched_step.py). Outside the
host sampler's many small launches and host-to-device copies, the step then waits only on its
graph, and the next step can be launched from the samples before they are read.

A step samples in the graph when every sequence that samples in it has graph-sampleable
settings in both streams (`in_graph`): greedy, or top-k of 1..TOP_K_WIDTH, with no repetition
penalty (it reads the history), no presence or frequency penalty, no nucleus and no
alternatives asked for. Otherwise the graph's logits go to the host sampler as before. The two
paths draw the same uniforms (one pair per sampling sequence and step) and compute the same ops
(layers/sampler.py): the tokens do not depend on which one ran.
"""

from __future__ import annotations

import functools

import torch

from kimiaudio.audio.device_result import copy_in
from kimiaudio.engine.sequence import Sequence
from kimiaudio.layers.sampler import TOP_K_WIDTH, sample_greedy_or_top_k
from kimiaudio.layers.stream_sampling import StreamSampling

# Rows of the static buffer [6, max_batch] long: top-k (0 = greedy), then temperature and
# uniform as float64 bits, each for the text rows then the audio rows.
TOP_K, TEMPERATURE, UNIFORM = 0, 2, 4


@functools.cache
def graph_sampleable(stream: StreamSampling) -> bool:
    """Whether a stream's settings are what `sample_greedy_or_top_k` computes."""
    plain = stream.repetition_penalty <= 1.0 and not stream.counts_penalised and stream.top_p >= 1.0
    return plain and (stream.is_greedy or 1 <= stream.top_k <= TOP_K_WIDTH)


def in_graph(seqs: list[Sequence]) -> bool:
    """Whether every one of these sampling sequences can be sampled in the graph."""
    return all(
        seq.params.text_top_logprobs == 0 and graph_sampleable(seq.params.text) and graph_sampleable(seq.params.audio)
        for seq in seqs
    )


class GraphSampling:
    def __init__(self, max_batch: int, device: torch.device):
        self.fields = torch.zeros(6, max_batch, dtype=torch.long, device=device)

    def sample(self, text_logits: torch.Tensor, audio_logits: torch.Tensor) -> torch.Tensor:
        """Both heads' logits [Bp, V] -> float64 [2, 2 * Bp]: the tokens (text rows, then audio
        rows) and their log-probabilities. Device ops only: the graph captures them."""
        padded = text_logits.shape[0]
        fields = self.fields[:, :padded]
        top_ks = fields[TOP_K : TOP_K + 2].flatten()
        temperatures = fields[TEMPERATURE : TEMPERATURE + 2].view(torch.float64).flatten().float()
        uniforms = fields[UNIFORM : UNIFORM + 2].view(torch.float64).flatten().float()
        logits = torch.cat([text_logits, audio_logits])
        tokens, logprobs = sample_greedy_or_top_k(logits, top_ks, temperatures, uniforms)
        return torch.stack([tokens.double(), logprobs.double()])

    def write(self, seqs: list[Sequence], rows: list[int], padded: int) -> None:
        """Draw the uniforms of the sequences `rows` of the batch (its sampling ones) and write
        their settings into the buffer, on the current stream (the other rows: greedy)."""
        top_ks = [[0] * padded for _ in range(2)]
        floats = [[0.0] * padded for _ in range(4)]  # temperatures, then uniforms
        for row in rows:
            seq = seqs[row]
            for stream, (params, u) in enumerate(zip((seq.params.text, seq.params.audio), seq.random.next_uniforms())):
                top_ks[stream][row] = 0 if params.is_greedy else params.top_k
                floats[stream][row] = params.temperature
                floats[2 + stream][row] = u
        host = torch.cat([torch.tensor(top_ks), torch.tensor(floats, dtype=torch.float64).view(torch.long)])
        copy_in(self.fields[:, :padded], host)
