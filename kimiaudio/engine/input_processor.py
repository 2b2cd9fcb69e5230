"""A request into the engine: validated against the model and the engine's limits, made a
Sequence (its positions and their prefix-cache keys, generation rules, sampling stream).

Follows vLLM v1's input processor: everything about one request that can be wrong is found
here, before it is queued, so a bad request fails alone with a RequestError naming it.
"""

from __future__ import annotations

import hashlib

import torch

from kimiaudio.config import EngineConfig
from kimiaudio.engine.request import (
    ANSWER_PRIORITY,
    BACKGROUND_PRIORITY,
    EngineRequest,
    PromptTooLongError,
    RequestError,
)
from kimiaudio.engine.sampling_params import RequestRandom, SamplingParams
from kimiaudio.engine.sequence import PromptPositions, Sequence
from kimiaudio.engine.stop_rules import RuleTokens, StreamRules, official_max_new_tokens
from kimiaudio.models.kimia_config import KimiaConfig
from kimiaudio.text.output_type import check_output_type


def feature_digests(features: torch.Tensor) -> list[str]:
    """One digest per feature row [N, D] (over its float32 bytes): the prefix-cache key part."""
    data = features.detach().to("cpu", torch.float32).contiguous().numpy()
    return [hashlib.blake2b(row.tobytes(), digest_size=16).hexdigest() for row in data]


def new_sequence(
    seq_id: int,
    request: EngineRequest,
    model: KimiaConfig,
    config: EngineConfig,
    max_len: int,
    device: torch.device,
    dtype: torch.dtype,
) -> Sequence:
    """The engine's Sequence of a request, validated against the model's config and the
    engine's limits, `max_len` the positions one sequence may hold; raises RequestError
    (PromptTooLongError) naming the request."""
    rid, prompt = request.request_id, request.prompt
    n = len(prompt.audio_ids)
    if n == 0:
        raise RequestError(f"request {rid}: empty prompt")
    if len(prompt.text_ids) != n or len(prompt.continuous_mask) != n:
        raise RequestError(
            f"request {rid}: audio_ids, text_ids and continuous_mask must have one entry per "
            f"position (got {n}, {len(prompt.text_ids)}, {len(prompt.continuous_mask)})"
        )
    check_output_type(request.output_type, f"request {rid}: output_type", RequestError)
    if not isinstance(request.params, SamplingParams):
        raise RequestError(f"request {rid}: params must be a SamplingParams")
    vocab = model.vocab_size
    for name, ids in (("audio_ids", prompt.audio_ids), ("text_ids", prompt.text_ids)):
        if any(not 0 <= int(t) < vocab for t in ids):
            raise RequestError(f"request {rid}: {name} must lie in [0, {vocab})")
    if n > max_len:
        # (No request id: the message is the client's, who knows the request by no such id.)
        bound = f"engine.max_model_len ({max_len})"
        if max_len < config.max_model_len:
            bound = f"the KV pool's {max_len} positions (fewer than engine.max_model_len, {config.max_model_len})"
        raise PromptTooLongError(f"prompt of {n} positions exceeds {bound}")
    mask = [bool(m) for m in prompt.continuous_mask]
    features = _features(rid, prompt.features, sum(mask), model)
    if features is None:
        mask = [False] * n  # nothing to add at those positions: plain embeddings, as the reference
    digests: list[str | None] = [None] * n
    if features is not None:
        rows = iter(feature_digests(features))
        digests = [next(rows) if m else None for m in mask]
    audio_ids = [int(t) for t in prompt.audio_ids]
    text_ids = [int(t) for t in prompt.text_ids]
    use_text = [sum(text_ids) != 0] * n  # the reference prefill: one decision for the prompt
    limit = official_max_new_tokens(request.output_type, n, request.params.max_new_tokens)
    limit = min(limit, max_len - n + 1)  # the last sample's position needs no K/V
    try:
        tokens = RuleTokens.from_specials(request.specials)
    except (AttributeError, TypeError, ValueError) as exc:
        raise RequestError(f"request {rid}: specials lack a generation-rule token id ({exc})") from None
    if not isinstance(request.priority, int) or request.priority not in (ANSWER_PRIORITY, BACKGROUND_PRIORITY):
        raise RequestError(
            f"request {rid}: priority must be {ANSWER_PRIORITY} (an answer) or "
            f"{BACKGROUND_PRIORITY} (background), got {request.priority!r}"
        )
    delay = model.kimia_mimo_audiodelaytokens
    return Sequence(
        seq_id,
        rid,
        PromptPositions(audio_ids, text_ids, use_text, mask, digests),
        block_size=config.block_size,
        max_num_tokens=n + max(limit, 1) - 1,
        priority=request.priority,
        rules=StreamRules(request.output_type, tokens, delay, limit, request.params.ignore_eos),
        params=request.params,
        random=RequestRandom(request.params.seed),
        features=None if features is None else features.to(device, dtype),
    )


def _features(rid: str, features, num_continuous: int, model: KimiaConfig) -> torch.Tensor | None:
    """None, a [N, D] / [1, N, D] tensor or a list of them -> [N, D] or None, validated."""
    if features is None or not model.use_whisper_feature:
        return None  # official: a checkpoint without the VQ adaptor ignores the features
    parts = [features] if isinstance(features, torch.Tensor) else list(features)
    if not parts:
        return None
    if any(not isinstance(p, torch.Tensor) or not p.is_floating_point() for p in parts):
        raise RequestError(f"request {rid}: features must be float tensors")
    dim = model.kimia_adaptor_input_dim
    if any(p.dim() not in (2, 3) or p.shape[-1] != dim or (p.dim() == 3 and p.shape[0] != 1) for p in parts):
        raise RequestError(f"request {rid}: features must be [N, {dim}] tensors, got {[tuple(p.shape) for p in parts]}")
    rows = torch.cat([p.reshape(-1, dim) for p in parts])
    if rows.shape[0] != num_continuous:
        raise RequestError(f"request {rid}: {rows.shape[0]} feature rows for {num_continuous} continuous positions")
    return rows
