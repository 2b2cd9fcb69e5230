"""The batched token sampler (see stream_sampling.py for the parameters it takes).

Follows the official KimiASampler (kimia_infer/utils/sampler.py), applied to the text and the
audio stream alike:
1. repetition penalty, only if penalty > 1 and the stream's history (tokens fed back so far
   in this generation) is longer than the window: the last `window` tokens' logits become
   s * p where s < 0, else s / p (a token repeated in the window is penalised once);
2. logprobs = log_softmax(logits) in fp32;
3. temperature > 1e-6: logprobs / T, probs = exp(.) over the top-k (top_k > 0) or the whole
   vocabulary (top_k = 0), not renormalised; otherwise greedy argmax (first max).
The official code draws with torch.multinomial on the CUDA RNG, which cannot be reproduced;
here each row comes with its own uniform (from the request's RequestRandom) and the token is
picked by inverse CDF (first index whose cumulative weight exceeds u * total). A row's result
depends only on its own logits, params, history and uniform, so batching never changes it. No
host-device synchronisation inside `sample`.

Not official, and off by default (OpenAI's parameters): OpenAI's presence and frequency
penalties after step 1 (logit - presence * [count > 0] - frequency * count, over the counts a
row brings), and nucleus sampling in step 3 (top_p < 1: of the tokens by falling probability,
after top-k, those whose preceding mass is below top_p; the first always stays). `sample`
also returns each row's log-probability of its token and, for the rows that ask, the top
alternatives: from step 2's distribution (after the penalties, before temperature and
truncation, as vLLM reports them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from kimiaudio.layers.stream_sampling import StreamSampling

# Candidates a top-k draw always takes (at least): the official settings (text 5, audio 10) fit.
TOP_K_WIDTH = 16


@dataclass
class Sampled:
    """One sampling call's results, still on the device."""

    tokens: torch.Tensor  # [B] long
    logprobs: torch.Tensor  # [B] fp32: each row's log-probability of its token
    top_rows: list[int]  # rows that asked for alternatives
    top_ids: torch.Tensor | None  # [len(top_rows), n] long, by falling log-probability
    top_logprobs: torch.Tensor | None  # [len(top_rows), n] fp32


def sample(
    logits: torch.Tensor,
    params: Sequence[StreamSampling],
    histories: Sequence[Sequence[int]],
    uniforms: torch.Tensor,
    counts: Sequence[Mapping[int, int] | None] | None = None,
    top_logprobs: Sequence[int] | None = None,
) -> Sampled:
    """logits [B, V] (any float dtype), one StreamSampling, history and uniform per row -> the
    tokens [B] long, with the log-probabilities. Rows may mix streams and settings (e.g. text
    rows and audio rows of many requests); `counts`: per row, how often each token occurred (for
    the presence / frequency penalties); `top_logprobs`: per row, how many of the
    likeliest tokens to report (0 = none)."""
    rows = logits.shape[0]
    if not (len(params) == len(histories) == rows == uniforms.shape[0]):
        raise ValueError(
            f"sample: {rows} logits rows, {len(params)} params, "
            f"{len(histories)} histories, {uniforms.shape[0]} uniforms"
        )
    for p in params:
        if not isinstance(p, StreamSampling):
            raise TypeError("sample takes one StreamSampling per row: pass params.text or params.audio")
    device = logits.device
    logits = apply_repetition_penalty(logits, params, histories)
    logits = apply_count_penalties(logits, params, counts)
    logprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # [B, V]
    tokens = logprobs.argmax(dim=-1)  # greedy rows; first max
    sampled = [i for i, p in enumerate(params) if not p.is_greedy]
    if sampled:
        tokens = tokens.index_copy(0, _index(sampled, device), _draw(logprobs, params, sampled, uniforms))
    chosen = logprobs.gather(1, tokens[:, None]).squeeze(1)
    wanted = [i for i in range(rows) if top_logprobs[i] > 0] if top_logprobs else []
    top_ids = top_lps = None
    if top_logprobs and wanted:
        top_lps, top_ids = torch.topk(logprobs[_index(wanted, device)], max(top_logprobs[i] for i in wanted), dim=-1)
    return Sampled(tokens, chosen, wanted, top_ids, top_lps)


def _draw(
    logprobs: torch.Tensor, params: Sequence[StreamSampling], sampled: list[int], uniforms: torch.Tensor
) -> torch.Tensor:
    """The tokens of the sampled (not greedy) rows."""
    device = logprobs.device
    temps = torch.tensor([params[i].temperature for i in sampled], dtype=torch.float32)
    probs = torch.exp(logprobs[_index(sampled, device)] / temps.to(device, non_blocking=True)[:, None])
    u = uniforms.to(device=device, dtype=torch.float32, non_blocking=True)[_index(sampled, device)]
    picks = torch.empty(len(sampled), dtype=torch.long, device=device)
    # Three groups, so that the official rows (top-k, or all) compute exactly as before.
    nucleus_rows = [j for j, i in enumerate(sampled) if params[i].top_p < 1.0]
    top_k_rows = [j for j, i in enumerate(sampled) if params[i].top_k > 0 and params[i].top_p >= 1.0]
    full_rows = [j for j, i in enumerate(sampled) if params[i].top_k == 0 and params[i].top_p >= 1.0]
    vocab = probs.shape[1]
    if top_k_rows:
        ks = [min(params[sampled[j]].top_k, vocab) for j in top_k_rows]
        sub = _index(top_k_rows, device)
        width = min(vocab, max(TOP_K_WIDTH, *ks))
        picks[sub] = draw_top_k(probs[sub], torch.tensor(ks).to(device, non_blocking=True), u[sub], width)
    if nucleus_rows:
        ks = [min(params[sampled[j]].top_k, vocab) or vocab for j in nucleus_rows]
        sub = _index(nucleus_rows, device)
        top_probs, top_ids = torch.topk(probs[sub], max(ks), dim=-1)  # [R, kmax], descending
        keep = torch.arange(max(ks), device=device)[None, :] < torch.tensor(ks).to(device, non_blocking=True)[:, None]
        weights = torch.where(keep, top_probs, torch.zeros_like(top_probs))
        top_p = torch.tensor([params[sampled[j]].top_p for j in nucleus_rows], dtype=torch.float32)
        before = (weights.cumsum(dim=-1) - weights) / weights.sum(dim=-1, keepdim=True)  # mass ahead of each
        weights = torch.where(before < top_p.to(device, non_blocking=True)[:, None], weights, torch.zeros_like(weights))
        picked = _inverse_cdf(weights, u[sub])
        picks[sub] = top_ids.gather(1, picked[:, None]).squeeze(1)
    if full_rows:
        sub = _index(full_rows, device)
        picks[sub] = _inverse_cdf(probs[sub], u[sub])
    return picks


def draw_top_k(probs: torch.Tensor, ks: torch.Tensor, u: torch.Tensor, width: int) -> torch.Tensor:
    """probs [R, V] (unnormalised), ks [R] (1..width), u [R] -> token [R] drawn from each row's
    ks largest in proportion. The candidates are always the `width` largest (then masked to each
    row's k): a row's draw is then the same computation whatever other rows share its batch,
    and a fixed shape, which the decode graphs sample with (engine/graph_sampling.py)."""
    top_probs, top_ids = torch.topk(probs, width, dim=-1)  # [R, width], descending
    keep = torch.arange(width, device=probs.device)[None, :] < ks[:, None]
    picked = _inverse_cdf(torch.where(keep, top_probs, torch.zeros_like(top_probs)), u)
    return top_ids.gather(1, picked[:, None]).squeeze(1)


def sample_greedy_or_top_k(
    logits: torch.Tensor, top_ks: torch.Tensor, temperatures: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample` for rows without penalties, nucleus or alternatives, as fixed-shape device ops
    (no host work: a CUDA graph captures it). logits [B, V]; top_ks [B] long: 0 = greedy, else
    1..TOP_K_WIDTH; temperatures, uniforms [B] fp32 (a greedy row's are not read) -> (tokens [B]
    long, their log-probabilities [B] fp32), equal to `sample`'s for the same rows."""
    logprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    greedy = top_ks == 0
    probs = torch.exp(logprobs / torch.where(greedy, 1.0, temperatures)[:, None])
    width = min(TOP_K_WIDTH, logits.shape[1])
    drawn = draw_top_k(probs, top_ks.clamp(1, width), uniforms, width)
    tokens = torch.where(greedy, logprobs.argmax(dim=-1), drawn)
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


def _index(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """weights [R, N] >= 0 (unnormalised), u [R] in [0, 1) -> index [R] with P(i) ~ weights[i]."""
    cdf = weights.cumsum(dim=-1)
    target = u * cdf[:, -1]
    index = (cdf <= target[:, None]).sum(dim=-1)  # first index whose cdf exceeds the target
    # u * total can round up to total: fall back to the last index with positive weight.
    last_positive = (weights > 0).cumsum(dim=-1).argmax(dim=-1)
    return torch.minimum(index, last_positive)


def apply_repetition_penalty(
    logits: torch.Tensor, params: Sequence[StreamSampling], histories: Sequence[Sequence[int]]
) -> torch.Tensor:
    """logits [B, V] -> penalised copy (or `logits` itself when no row is penalised)."""
    rows: list[int] = []
    cols: list[int] = []
    penalties: list[float] = []
    for row, (p, history) in enumerate(zip(params, histories)):
        if not p.penalises(len(history)):
            continue
        window = dict.fromkeys(int(t) for t in history[-p.repetition_window :])  # duplicates once
        rows += [row] * len(window)
        cols += list(window)
        penalties += [p.repetition_penalty] * len(window)
    if not rows:
        return logits
    device = logits.device
    r, c = _index(rows, device), _index(cols, device)
    penalty = torch.tensor(penalties, dtype=torch.float32).to(device, non_blocking=True)
    scores = logits[r, c].float()
    # fp32 math and one rounding to the logits dtype, as the official in-dtype ops on CUDA
    # (which divide by a scalar as a multiply by its fp32 reciprocal).
    scores = torch.where(scores < 0, scores * penalty, scores * (1.0 / penalty)).to(logits.dtype)
    logits = logits.clone()
    logits[r, c] = scores
    return logits


def apply_count_penalties(
    logits: torch.Tensor, params: Sequence[StreamSampling], counts: Sequence[Mapping[int, int] | None] | None
) -> torch.Tensor:
    """OpenAI's presence and frequency penalties: logits [B, V] -> penalised copy (or `logits`)."""
    rows: list[int] = []
    cols: list[int] = []
    amounts: list[float] = []
    for row, p in enumerate(params):
        seen = counts[row] if counts is not None else None
        if not seen or not p.counts_penalised:
            continue
        for token, count in seen.items():
            rows.append(row)
            cols.append(int(token))
            amounts.append(p.presence_penalty + p.frequency_penalty * count)
    if not rows:
        return logits
    device = logits.device
    r, c = _index(rows, device), _index(cols, device)
    amount = torch.tensor(amounts, dtype=torch.float32).to(device, non_blocking=True)
    logits = logits.clone()
    logits[r, c] = (logits[r, c].float() - amount).to(logits.dtype)
    return logits
