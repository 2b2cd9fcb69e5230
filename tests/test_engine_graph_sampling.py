"""Sampling inside the decode graph (engine/graph_sampling.py) against the host sampler.

The graph's ops run eagerly here (on the CPU; they are device ops only, what a CUDA graph
captures): for the same sequences, logits and request streams they must give the host
sampler's tokens and log-probabilities exactly, and draw the same uniforms. The graphs
themselves replay them on a GPU (tests/test_gpu.py compares graphs with eager steps).
"""

from __future__ import annotations

import torch

from kimiaudio.engine.graph_sampling import GraphSampling, graph_sampleable, in_graph
from kimiaudio.engine.launched_step import read_samples
from kimiaudio.engine.sampling_params import RequestRandom, SamplingParams
from kimiaudio.engine.sequence import Sequence
from kimiaudio.layers.sampler import sample

from helpers.sequences import make_sequence


def sequence(seq_id: int, params: SamplingParams) -> Sequence:
    """A one-position sequence sampling with `params` from its seed's random stream."""
    seq = make_sequence(seq_id, [1], block_size=16)
    seq.params, seq.random = params, RequestRandom(params.seed)
    return seq


def test_graph_samples_equal_the_host_samplers():
    settings = [
        SamplingParams(seed=1),  # the defaults: text greedy, audio top-10 at 0.8
        SamplingParams(seed=2, text_temperature=1.0, text_top_k=3, audio_top_k=16),
        SamplingParams(seed=3, audio_temperature=0.0),
        SamplingParams(seed=4, audio_top_k=1, text_temperature=0.5, text_top_k=16),
    ]
    seqs = [sequence(i, p) for i, p in enumerate(settings)] + [sequence(9, SamplingParams(seed=5))]
    rows = [0, 1, 2, 3]  # the last sequence does not sample this step (a prefill chunk)
    padded, vocab = 8, 300
    gen = torch.Generator().manual_seed(0)
    text_logits = torch.randn(padded, vocab, generator=gen) * 4
    audio_logits = torch.randn(padded, vocab, generator=gen) * 4
    graph = GraphSampling(padded, torch.device("cpu"))
    twins = [sequence(i, seqs[i].params) for i in rows]  # the same random streams, for the host
    assert in_graph([seqs[i] for i in rows])
    for _ in range(3):  # each step draws the next pair of uniforms of every sampling sequence
        graph.write(seqs, rows, padded)
        got = read_samples(graph.sample(text_logits, audio_logits), rows)
        pairs = [twin.random.next_uniforms() for twin in twins]
        n = len(rows)
        host = sample(
            torch.cat([text_logits[rows], audio_logits[rows]]),
            [seqs[i].params.text for i in rows] + [seqs[i].params.audio for i in rows],
            [[]] * (2 * n),
            torch.tensor([t for t, _ in pairs] + [a for _, a in pairs]),
        )
        tokens, logprobs = host.tokens.tolist(), host.logprobs.tolist()
        assert got == [(tokens[k], tokens[n + k], logprobs[k], None) for k in range(n)]
        text_logits, audio_logits = text_logits.roll(1, 1), audio_logits.roll(3, 1)


def test_which_settings_sample_in_the_graph():
    assert graph_sampleable(SamplingParams().text) and graph_sampleable(SamplingParams().audio)
    assert not graph_sampleable(SamplingParams(audio_top_k=0).audio)  # the whole vocabulary: host
    assert not graph_sampleable(SamplingParams(audio_top_k=17).audio)
    assert graph_sampleable(SamplingParams(text_top_k=0).text)  # greedy: top-k plays no part
    assert not graph_sampleable(SamplingParams(audio_repetition_penalty=1.1).audio)
    assert not graph_sampleable(SamplingParams(text_top_p=0.9, text_temperature=1.0).text)
    assert not graph_sampleable(SamplingParams(text_presence_penalty=0.5).text)
    assert not in_graph([sequence(0, SamplingParams(text_top_logprobs=2))])
