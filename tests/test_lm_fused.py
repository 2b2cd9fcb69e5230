"""Fused projections: one qkv GEMM and one gate/up GEMM per layer, made in memory after the
checkpoint loads by its official names; the logits stay those of the separate projections."""

from __future__ import annotations

import torch

from kimiaudio.layers.attention import ContiguousKVCache
from kimiaudio.models.kimia_lm import KimiAudioLM

from helpers.engine_scenarios import load_tiny_lm
from helpers.lm_golden import SECTIONS, TOL, forward_logits


def test_load_fuses_every_layer_and_frees_the_originals(golden_checkpoint):
    lm = load_tiny_lm(golden_checkpoint)
    for layer in [*lm.model.layers, *lm.model.mimo_layers]:
        attn, mlp = layer.self_attn, layer.mlp
        assert attn.q_proj is None and attn.k_proj is None and attn.v_proj is None
        assert mlp.gate_proj is None and mlp.up_proj is None
        q, kv = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
        assert attn.qkv_proj.weight.shape == (q + 2 * kv, lm.config.hidden_size)
        assert attn.qkv_proj.bias.shape == (q + 2 * kv,)
        assert mlp.gate_up_proj.weight.shape == (2 * lm.config.intermediate_size, lm.config.hidden_size)
    modules = {name.split(".")[-2] for name, _ in lm.named_parameters()}
    assert not modules & {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}
    before = {name: t.clone() for name, t in lm.state_dict().items()}
    lm.fuse_projections()  # idempotent: a second call changes nothing
    after = lm.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], v) for k, v in before.items())


def test_fused_equals_separate_projections(golden_checkpoint, golden):
    fused = load_tiny_lm(golden_checkpoint)
    separate = KimiAudioLM(fused.config).eval()
    # The separate model gets the fused weights back, split along the output rows.
    with torch.no_grad():
        for a, b in zip(
            [*fused.model.layers, *fused.model.mimo_layers], [*separate.model.layers, *separate.model.mimo_layers]
        ):
            q, k, v = b.self_attn.q_proj, b.self_attn.k_proj, b.self_attn.v_proj
            sizes = [q.out_features, k.out_features, v.out_features]
            for part, w, bias in zip(
                (q, k, v), a.self_attn.qkv_proj.weight.split(sizes), a.self_attn.qkv_proj.bias.split(sizes)
            ):
                part.weight.copy_(w)
                part.bias.copy_(bias)
            gate, up = a.mlp.gate_up_proj.weight.chunk(2)
            b.mlp.gate_proj.weight.copy_(gate)
            b.mlp.up_proj.weight.copy_(up)
        own = separate.state_dict()
        for name, tensor in fused.state_dict().items():
            if name in own:
                own[name].copy_(tensor)
    for section in SECTIONS:
        expected = forward_logits(separate, golden, section)
        got = forward_logits(fused, golden, section)
        for head, e, g in zip(("text", "audio"), expected, got):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(g, golden[f"{section}.forward.{head}_logits"][0], **TOL)


def test_fused_model_decodes_through_a_cache(golden_checkpoint):
    lm = load_tiny_lm(golden_checkpoint)
    ids = torch.arange(1, 9)
    with torch.no_grad():
        full, _ = lm(
            lm.embed(ids, ids, torch.ones(8, dtype=torch.bool)),
            torch.arange(8),
            ContiguousKVCache(lm.config.num_kv_layers, "cpu", torch.float32),
        )
        cache = ContiguousKVCache(lm.config.num_kv_layers, "cpu", torch.float32)
        rows = [
            lm(lm.embed(ids[i : i + 1], ids[i : i + 1], torch.ones(1, dtype=torch.bool)), torch.tensor([i]), cache)[0]
            for i in range(8)
        ]
    torch.testing.assert_close(torch.cat(rows), full, atol=1e-5, rtol=1e-5)
