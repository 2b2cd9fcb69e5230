"""The batched sampler: official repetition-penalty semantics, greedy/top-k/full sampling by
inverse CDF, per-request seeded uniforms, and batch independence; OpenAI's top_p, presence and
frequency penalties, and the log-probabilities it reports."""

from __future__ import annotations

import pytest
import torch

from kimiaudio.config import SamplingConfig
from kimiaudio.engine.sampling_params import RequestRandom, SamplingParams
from kimiaudio.engine.stop_rules import RuleTokens, StreamRules
from kimiaudio.errors import ConfigError
from kimiaudio.layers.sampler import apply_repetition_penalty, sample
from kimiaudio.layers.stream_sampling import StreamSampling


def sample_tokens(*args):
    """The sampled tokens alone."""
    return sample(*args).tokens


def stream(
    temperature: float = 0.0,
    top_k: int = 5,
    repetition_penalty: float = 1.0,
    repetition_window: int = 16,
    top_p: float = 1.0,
    presence: float = 0.0,
    frequency: float = 0.0,
) -> StreamSampling:
    """A stream's settings; unnamed ones as the text stream's defaults."""
    return StreamSampling(temperature, top_k, repetition_penalty, repetition_window, top_p, presence, frequency)


def _logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 2


def test_repetition_penalty_official_semantics():
    logits = torch.tensor([[3.0, 2.0, -1.0, 0.5]])
    p = stream(repetition_penalty=2.0, repetition_window=3)
    # window = last 3 tokens [1, 2, 2]: token 0 is outside it, token 2 is penalised once.
    out = apply_repetition_penalty(logits, [p], [[0, 1, 2, 2]])
    assert out.tolist() == [[3.0, 1.0, -2.0, 0.5]]
    assert logits.tolist() == [[3.0, 2.0, -1.0, 0.5]]  # caller's logits untouched
    # Only when the history is longer than the window, and only for penalty > 1.
    assert apply_repetition_penalty(logits, [p], [[1, 2, 2]]).tolist() == logits.tolist()
    p1 = stream(repetition_penalty=1.0, repetition_window=1)
    assert apply_repetition_penalty(logits, [p1], [[0, 1, 2]]).tolist() == logits.tolist()


def test_repetition_penalty_changes_greedy_choice():
    logits = torch.tensor([[2.0, 2.5], [2.0, 2.5]])
    greedy = stream(temperature=0.0, repetition_penalty=2.0, repetition_window=1)
    tokens = sample(logits, [greedy, greedy], [[1, 1], [1]], torch.zeros(2)).tokens
    assert tokens.tolist() == [0, 1]  # row 1: history not longer than the window


def test_greedy_is_first_argmax():
    logits = torch.tensor([[1.0, 5.0, 5.0, 0.0]])
    assert sample_tokens(logits, [stream()], [[]], torch.tensor([0.7])).tolist() == [1]


def test_top_k_never_leaves_the_top_k_and_follows_the_probabilities():
    vocab, k, draws = 40, 4, 4000
    row = _logits(1, vocab, 1)
    p = stream(temperature=0.9, top_k=k)
    uniforms = torch.rand(draws, generator=torch.Generator().manual_seed(2))
    tokens = sample_tokens(row.expand(draws, vocab), [p] * draws, [[]] * draws, uniforms)
    probs = torch.softmax(row[0] / 0.9, dim=-1)
    top = probs.topk(k)
    assert set(tokens.tolist()) == set(top.indices.tolist())
    counts = torch.bincount(tokens, minlength=vocab)[top.indices].float() / draws
    torch.testing.assert_close(counts, top.values / top.values.sum(), atol=0.03, rtol=0)


def test_full_vocabulary_sampling_follows_the_probabilities():
    vocab, draws = 6, 6000
    row = torch.tensor([[0.0, 1.0, 2.0, -1.0, 0.5, 1.5]])
    p = stream(temperature=1.0, top_k=0)
    uniforms = torch.rand(draws, generator=torch.Generator().manual_seed(5))
    tokens = sample_tokens(row.expand(draws, vocab), [p] * draws, [[]] * draws, uniforms)
    freq = torch.bincount(tokens, minlength=vocab).float() / draws
    torch.testing.assert_close(freq, torch.softmax(row[0], -1), atol=0.025, rtol=0)


def test_extreme_uniforms_stay_in_range():
    row = torch.tensor([[0.0, 3.0, 1.0, -50.0, 2.0]])
    p = stream(temperature=1.0, top_k=2)
    tokens = sample_tokens(row.expand(3, 5), [p] * 3, [[]] * 3, torch.tensor([0.0, 0.5, 1.0 - 1e-8]))
    assert set(tokens.tolist()) <= {1, 4}
    q = stream(temperature=1.0, top_k=0)
    assert sample_tokens(row, [q], [[]], torch.tensor([1.0])).item() != 3  # never a ~zero-weight tail


def test_seeded_uniforms_are_deterministic():
    a, b, c = RequestRandom(11), RequestRandom(11), RequestRandom(12)
    seq_a = torch.tensor([a.next_uniforms() for _ in range(70)])  # crosses a drawn block
    seq_b = torch.tensor([b.next_uniforms() for _ in range(70)])
    assert torch.equal(seq_a, seq_b) and seq_a.shape == (70, 2)
    assert 0 <= seq_a.min() and seq_a.max() < 1 and seq_a.unique().numel() == 140
    assert not torch.equal(seq_a, torch.tensor([c.next_uniforms() for _ in range(70)]))
    assert RequestRandom(None).seed is not None


def test_mixed_batch_equals_rows_one_at_a_time():
    vocab = 30
    logits = _logits(6, vocab, 7).to(torch.bfloat16)
    params = [
        stream(temperature=0.0),
        stream(temperature=0.8, top_k=5),
        stream(temperature=1.2, top_k=0),
        stream(temperature=0.7, top_k=12, repetition_penalty=1.3, repetition_window=3),
        stream(temperature=0.0, repetition_penalty=5.0, repetition_window=2),
        stream(temperature=1.0, top_k=1),
        stream(temperature=1.1, top_k=0, top_p=0.6, presence=0.5, frequency=0.3),
        stream(temperature=0.9, top_k=7, top_p=0.4),
    ]
    histories = [[], [3], [], [1, 2, 3, 4, 4], [0, 9, 9], [], [5, 5], []]
    counts = [None, {3: 1}, None, None, None, None, {5: 2, 1: 1}, None]
    uniforms = torch.rand(8, generator=torch.Generator().manual_seed(9))
    logits = torch.cat([logits, _logits(2, vocab, 8).to(torch.bfloat16)])
    batched = sample_tokens(logits, params, histories, uniforms, counts)
    single = [
        sample_tokens(logits[i : i + 1], [params[i]], [histories[i]], uniforms[i : i + 1], [counts[i]]).item()
        for i in range(8)
    ]
    assert batched.tolist() == single
    assert batched.dtype == torch.long


def test_sampling_params_build_and_validate():
    params = SamplingParams.from_config(SamplingConfig(), seed=5)
    assert params.audio == StreamSampling(0.8, 10, 1.0, 64) and params.text == StreamSampling(0.0, 5, 1.0, 16)
    assert params.seed == 5 and params.max_new_tokens == 0
    greedy = SamplingParams.greedy()
    assert greedy.text.is_greedy and greedy.audio.is_greedy and greedy.audio.top_k == params.audio.top_k
    with pytest.raises(ConfigError, match="top_k"):
        SamplingParams(audio_top_k=-1)
    with pytest.raises(ConfigError, match="temperature"):
        SamplingParams(text_temperature=-0.5)
    with pytest.raises(TypeError, match="params.text or params.audio"):
        sample_tokens(torch.zeros(1, 4), [params], [[]], torch.zeros(1))


def test_top_p_draws_only_from_the_nucleus_in_proportion():
    vocab, draws = 40, 4000
    row = _logits(1, vocab, 3)
    probs = torch.softmax(row[0], dim=-1)
    ordered = probs.sort(descending=True)
    before = ordered.values.cumsum(0) - ordered.values  # mass ahead of each token
    nucleus = ordered.indices[before < 0.5]
    assert 1 < len(nucleus) < vocab // 2  # the row is spread enough for the test to mean something
    uniforms = torch.rand(draws, generator=torch.Generator().manual_seed(4))
    p = stream(temperature=1.0, top_k=0, top_p=0.5)
    tokens = sample_tokens(row.expand(draws, vocab), [p] * draws, [[]] * draws, uniforms)
    assert set(tokens.tolist()) == set(nucleus.tolist())
    expected = probs[nucleus] / probs[nucleus].sum()
    observed = torch.bincount(tokens, minlength=vocab)[nucleus].float() / draws
    assert torch.allclose(observed, expected, atol=0.03)
    # After top-k: the nucleus of the k likeliest.
    narrow = stream(temperature=1.0, top_k=2, top_p=0.99)
    tokens = sample_tokens(row.expand(500, vocab), [narrow] * 500, [[]] * 500, uniforms[:500])
    assert set(tokens.tolist()) == set(ordered.indices[:2].tolist())
    # top_p = 1 leaves top-k sampling exactly as it was.
    assert torch.equal(
        sample_tokens(row.expand(500, vocab), [stream(0.9, 4, top_p=1.0)] * 500, [[]] * 500, uniforms[:500]),
        sample_tokens(row.expand(500, vocab), [stream(0.9, 4)] * 500, [[]] * 500, uniforms[:500]),
    )


def test_presence_and_frequency_penalties_lower_seen_tokens():
    logits = torch.tensor([[2.0, 1.5, 0.0]])
    seen_once, seen_twice = {0: 1}, {0: 2}
    greedy = stream(temperature=0.0)
    assert sample_tokens(logits, [greedy], [[0]], torch.zeros(1), [seen_once]).tolist() == [0]
    presence = stream(temperature=0.0, presence=0.6)
    assert sample_tokens(logits, [presence], [[0]], torch.zeros(1), [seen_once]).tolist() == [1]
    frequency = stream(temperature=0.0, frequency=0.4)  # 2.0 - 0.4 * count
    assert sample_tokens(logits, [frequency], [[0]], torch.zeros(1), [seen_once]).tolist() == [0]
    assert sample_tokens(logits, [frequency], [[0, 0]], torch.zeros(1), [seen_twice]).tolist() == [1]
    negative = stream(temperature=0.0, presence=-1.0)  # a negative penalty favours seen tokens
    assert sample_tokens(torch.tensor([[1.5, 2.0]]), [negative], [[0]], torch.zeros(1), [seen_once]).tolist() == [0]
    # The reported log-probability is of the penalised distribution.
    out = sample(logits, [frequency], [[0, 0]], torch.zeros(1), [seen_twice], [2])
    penalised = torch.log_softmax(torch.tensor([1.2, 1.5, 0.0]), dim=-1)
    assert out.logprobs.tolist() == pytest.approx([penalised[1].item()])
    assert out.top_rows == [0] and out.top_ids.tolist() == [[1, 0]]
    assert out.top_logprobs[0].tolist() == pytest.approx([penalised[1].item(), penalised[0].item()])


def test_logprobs_are_the_sampled_tokens_own():
    logits = _logits(3, 25, 5)
    params = [stream(temperature=0.0), stream(temperature=1.0, top_k=0), stream(temperature=0.7, top_k=3, top_p=0.9)]
    out = sample(logits, params, [[]] * 3, torch.tensor([0.1, 0.6, 0.9]), None, [0, 3, 0])
    expected = torch.log_softmax(logits, dim=-1).gather(1, out.tokens[:, None]).squeeze(1)
    assert torch.allclose(out.logprobs, expected)
    assert out.top_rows == [1] and out.top_ids[0].tolist() == torch.log_softmax(logits[1], -1).topk(3).indices.tolist()


def test_stop_rules_count_the_text_tokens_for_the_penalties():
    rules = StreamRules("text", RuleTokens(text_blank=9, text_eos=8, msg_end=7, media_end=6), 0, 10)
    for token in (3, 9, 3, 4):
        rules.step(token, 0)
    assert rules.text_counts == {3: 2, 4: 1}  # the blank paces the stream: not counted
