"""The batch-1 reference generation loop: the definition of correct for the engine.

Follows KimiAudio._generate_loop: prefill the whole prompt at positions 0..L-1 (with the
continuous features), then one position per step, feeding both sampled tokens back (audio ->
audio stream, text -> text stream) through a contiguous KV cache. The text embedding is
skipped for a forward call whose text ids sum to 0 (the whole prompt at prefill, the single
text token at decode), as the official model does. Text is sampled before audio, each with
the request's own uniform (sampling_params.RequestRandom), and the official rules
(stop_rules.py) decide what is fed back and when to stop. One loop: `generate_reference` drains
`iter_reference`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kimiaudio.engine.sampling_params import RequestRandom, SamplingParams
from kimiaudio.engine.stop_rules import RuleTokens, StreamRules, official_max_new_tokens
from kimiaudio.layers.attention import ContiguousKVCache
from kimiaudio.layers.sampler import sample
from kimiaudio.models.kimia_lm import KimiAudioLM


@dataclass
class ReferenceStep:
    """One executed step: the forward's last-position logits, raw samples, tokens after the rules."""

    position: int  # position id of the last input token of this step's forward
    sampled_text: int
    sampled_audio: int
    text_token: int
    audio_token: int
    finished: bool
    reason: str | None
    text_logits: torch.Tensor | None = None  # [V] on the CPU, only with record_steps
    audio_logits: torch.Tensor | None = None


@dataclass
class GenerationResult:
    text_tokens: list[int]  # official _generate_loop return values (raw ids)
    audio_tokens: list[int]
    finish_reason: str | None
    steps: list[ReferenceStep] = field(default_factory=list)  # every step with record_steps
    num_steps: int = 0  # generated positions: one per forward (the prefill, then each decode)


def _as_long(values: Any, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.long).reshape(-1).to(device)


def _prompt_features(features: Any, device: torch.device) -> torch.Tensor | None:
    """None, one [N, D] tensor or a list of [N_i, D] / [1, N_i, D] tensors -> [N, D] or None."""
    if features is None:
        return None
    if isinstance(features, torch.Tensor):
        features = [features]
    rows = [f.reshape(-1, f.shape[-1]) for f in features]
    return torch.cat(rows, dim=0).to(device) if rows else None


def reference_rules(
    lm: KimiAudioLM, prompt_len: int, params: SamplingParams, output_type: str, specials: Any
) -> StreamRules:
    """The official rules for one request: delay from config.json, the official length limit."""
    limit = official_max_new_tokens(output_type, prompt_len, params.max_new_tokens)
    return StreamRules(
        output_type, RuleTokens.from_specials(specials), lm.config.kimia_mimo_audiodelaytokens, limit, params.ignore_eos
    )


def iter_reference(
    lm: KimiAudioLM,
    prompt_audio_ids: Sequence[int] | torch.Tensor,
    prompt_text_ids: Sequence[int] | torch.Tensor,
    continuous_mask: Sequence[int] | torch.Tensor | None,
    features: torch.Tensor | Sequence[torch.Tensor] | None,
    params: SamplingParams,
    output_type: str,
    specials: Any,
    device: torch.device | str | None = None,
    record_steps: bool = False,
    rules: StreamRules | None = None,
) -> Iterator[ReferenceStep]:
    """Yield one ReferenceStep per generated position until the official rules stop.

    `specials`: RuleTokens or any object with text_blank, text_eos, msg_end, media_end.
    `rules`: pass your own StreamRules to read its official return values afterwards.
    """
    device = torch.device(device) if device is not None else lm.device
    audio_ids = _as_long(prompt_audio_ids, device)
    text_ids = _as_long(prompt_text_ids, device)
    prompt_len = audio_ids.shape[0]
    if text_ids.shape[0] != prompt_len or prompt_len == 0:
        raise ValueError(f"prompt streams must be non-empty and of equal length ({prompt_len} vs {text_ids.shape[0]})")
    mask = (
        torch.zeros(prompt_len, dtype=torch.bool)
        if continuous_mask is None
        else torch.as_tensor(continuous_mask).reshape(-1).to("cpu", torch.bool)
    )
    feature_positions = mask.nonzero().squeeze(1).to(device)  # found on the host
    if rules is None:
        rules = reference_rules(lm, prompt_len, params, output_type, specials)
    rng = RequestRandom(params.seed)
    cache = ContiguousKVCache(lm.config.num_kv_layers, device, lm.dtype)
    text_params, audio_params = params.text, params.audio

    # Inference mode per call, never across a yield (the consumer's code runs in between).
    @torch.inference_mode()
    def forward_and_sample(hidden, positions, last_row):
        text_logits, audio_logits = lm(hidden, positions, cache, logits_rows=last_row)  # [1, V] each
        uniforms = torch.tensor(rng.next_uniforms())  # text is sampled before audio
        text = int(sample(text_logits, [text_params], [rules.text_history], uniforms[:1], [rules.text_counts]).tokens)
        audio = int(sample(audio_logits, [audio_params], [rules.audio_history], uniforms[1:]).tokens)
        return text_logits, audio_logits, text, audio

    embed = torch.inference_mode()(lm.embed)
    use_text = torch.full((prompt_len,), bool(text_ids.sum() != 0), device=device)
    hidden = embed(audio_ids, text_ids, use_text, _prompt_features(features, device), feature_positions)
    positions = torch.arange(prompt_len, device=device)
    last_row = torch.tensor([prompt_len - 1], device=device)
    position = prompt_len - 1  # of the last input token; kept on the host (reading it back would sync)
    while not rules.is_finished:
        text_logits, audio_logits, sampled_text, sampled_audio = forward_and_sample(hidden, positions, last_row)
        text, audio, finished, reason = rules.step(sampled_text, sampled_audio)
        yield ReferenceStep(
            position,
            sampled_text,
            sampled_audio,
            text,
            audio,
            finished,
            reason,
            text_logits[0].float().cpu() if record_steps else None,
            audio_logits[0].float().cpu() if record_steps else None,
        )
        if rules.is_finished:
            break
        # Next step: both tokens fed back; the text embedding only if this call's text ids
        # sum to nonzero (here: the single text token is not id 0), as official.
        next_text = torch.tensor([text], device=device)
        hidden = embed(torch.tensor([audio], device=device), next_text, next_text != 0)
        position += 1
        positions = torch.tensor([position], device=device)
        last_row = torch.zeros(1, dtype=torch.long, device=device)


def generate_reference(
    lm: KimiAudioLM,
    prompt_audio_ids: Sequence[int] | torch.Tensor,
    prompt_text_ids: Sequence[int] | torch.Tensor,
    continuous_mask: Sequence[int] | torch.Tensor | None,
    features: torch.Tensor | Sequence[torch.Tensor] | None,
    params: SamplingParams,
    output_type: str,
    specials: Any,
    device: torch.device | str | None = None,
    record_steps: bool = False,
) -> GenerationResult:
    """Run the reference loop to the end; see iter_reference."""
    prompt_len = torch.as_tensor(prompt_audio_ids).numel()
    rules = reference_rules(lm, prompt_len, params, output_type, specials)
    steps = list(
        iter_reference(
            lm,
            prompt_audio_ids,
            prompt_text_ids,
            continuous_mask,
            features,
            params,
            output_type,
            specials,
            device,
            record_steps,
            rules,
        )
    )
    return GenerationResult(
        rules.text_tokens, rules.audio_tokens, rules.finish_reason, steps if record_steps else [], rules.num_steps
    )
