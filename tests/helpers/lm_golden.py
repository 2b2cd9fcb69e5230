"""The LM's full-prompt forward on a golden section, as the golden tests compare it."""

from __future__ import annotations

import torch

from kimiaudio.layers.attention import ContiguousKVCache

SECTIONS = ["lm.text", "lm.both", "lm_e2e"]


TOL = dict(atol=1e-4, rtol=1e-4)


def golden_inputs(golden, section):
    return (
        golden[f"{section}.input.audio_input_ids"][0],
        golden[f"{section}.input.text_input_ids"][0],
        golden[f"{section}.input.is_continuous_mask"][0].bool(),
        golden[f"{section}.input.whisper_feature"][0],
    )


def forward_logits(lm, golden, section, rows=None):
    """One full-prompt forward of a golden section on lm's device -> (text, audio) logits on the CPU."""
    audio_ids, text_ids, mask, features = (t.to(lm.device) for t in golden_inputs(golden, section))
    positions = golden[f"{section}.input.position_ids"][0].to(lm.device)
    use_text = torch.full(mask.shape, bool(text_ids.sum() != 0), device=lm.device)
    with torch.inference_mode():
        hidden = lm.embed(audio_ids, text_ids, use_text, features, mask.nonzero().squeeze(1))
        text_logits, audio_logits = lm(
            hidden,
            positions,
            ContiguousKVCache(lm.config.num_kv_layers, lm.device, lm.dtype),
            None if rows is None else rows.to(lm.device),
        )
    return text_logits.cpu(), audio_logits.cpu()
