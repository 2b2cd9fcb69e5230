"""Our Qwen2 decoder stack against transformers' Qwen2ForCausalLM (independent reference).

Same random weights (GQA, q/k/v bias, a few layers) loaded by name into KimiAudioLM; with no
text embedding and no features the LM's text path is exactly a Qwen2 causal LM. Also checks
the contiguous KV cache: chunked prefill (q_len < kv_len, bottom-right causal) and single-token
decode reproduce the full forward, and a bf16 model stays close to fp32.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from kimiaudio.layers.attention import ContiguousKVCache
from kimiaudio.models.kimia_config import KimiaConfig
from kimiaudio.models.kimia_lm import KimiAudioLM

VOCAB = 96
NUM_TOKENS = 11


@pytest.fixture(scope="module")
def models():
    hf_config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    hf = Qwen2ForCausalLM(hf_config).eval()
    config = KimiaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        kimia_mimo_layers=1,
        kimia_mimo_transformer_from_layer_index=1,
        kimia_token_offset=VOCAB,
        kimia_adaptor_input_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=128,
    )
    ours = KimiAudioLM(config).eval()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for module in (hf, ours):
            for param in module.parameters():
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
        own = ours.state_dict()
        for name, tensor in hf.state_dict().items():
            own[name].copy_(tensor)  # KeyError here = a name that differs from the checkpoint layout
    ids = torch.randint(0, VOCAB, (NUM_TOKENS,), generator=gen)
    return hf, ours, ids


def _embed(lm, ids):
    zeros = torch.zeros_like(ids)
    return lm.embed(ids, zeros, zeros.bool())


def test_full_forward_matches_transformers(models):
    hf, ours, ids = models
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
        text_logits, audio_logits = ours(
            _embed(ours, ids),
            torch.arange(NUM_TOKENS),
            ContiguousKVCache(ours.config.num_kv_layers, "cpu", torch.float32),
        )
    torch.testing.assert_close(text_logits, expected, atol=1e-5, rtol=1e-5)
    assert audio_logits.shape == expected.shape


def test_chunked_prefill_and_decode_match_full_forward(models):
    hf, ours, ids = models
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
        cache = ContiguousKVCache(ours.config.num_kv_layers, "cpu", torch.float32)
        _, full_audio = ours(
            _embed(ours, ids),
            torch.arange(NUM_TOKENS),
            ContiguousKVCache(ours.config.num_kv_layers, "cpu", torch.float32),
        )
        text_rows, audio_rows = [], []
        for start, stop in [(0, 5), (5, 8), (8, 9), (9, 10), (10, 11)]:  # prefill, chunk, decodes
            text, audio = ours(_embed(ours, ids[start:stop]), torch.arange(start, stop), cache)
            text_rows.append(text)
            audio_rows.append(audio)
        assert cache.num_tokens == NUM_TOKENS
    torch.testing.assert_close(torch.cat(text_rows), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(audio_rows), full_audio, atol=1e-5, rtol=1e-5)


def test_bfloat16_model_stays_close(models):
    _, ours, ids = models
    bf16 = KimiAudioLM(ours.config).eval()
    bf16.load_state_dict(ours.state_dict())
    bf16 = bf16.to(torch.bfloat16)
    with torch.no_grad():
        ref, _ = ours(
            _embed(ours, ids),
            torch.arange(NUM_TOKENS),
            ContiguousKVCache(ours.config.num_kv_layers, "cpu", torch.float32),
        )
        low, _ = bf16(
            _embed(bf16, ids),
            torch.arange(NUM_TOKENS),
            ContiguousKVCache(ours.config.num_kv_layers, "cpu", torch.bfloat16),
        )
    assert low.dtype == torch.bfloat16
    assert (low.float() - ref).abs().max() < 0.1 * ref.abs().max()
