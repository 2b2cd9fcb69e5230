"""Kimi-Audio LM against the official goldens (tiny random checkpoint, fp32 CPU).

Full-prompt forward logits on every position, and the greedy reference loop reproducing every
recorded step of the official _generate_loop (logits, raw argmaxes, tokens after the rules,
positions, return values). Ids come from golden.meta.json, never from constants.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from kimiaudio.checkpoint.paths import CheckpointPaths
from kimiaudio.engine.reference_loop import generate_reference, iter_reference
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import CheckpointError
from kimiaudio.layers.attention import ContiguousKVCache
from kimiaudio.models.kimia_config import KimiaConfig
from kimiaudio.models.kimia_lm import load_lm

from helpers.engine_scenarios import load_tiny_lm
from helpers.lm_golden import SECTIONS, TOL, forward_logits, golden_inputs


@pytest.fixture(scope="module")
def lm(golden_checkpoint):
    return load_tiny_lm(golden_checkpoint)


@pytest.mark.parametrize("section", SECTIONS)
def test_full_prompt_forward_matches_golden(lm, golden, section):
    text_logits, audio_logits = forward_logits(lm, golden, section)
    torch.testing.assert_close(text_logits, golden[f"{section}.forward.text_logits"][0], **TOL)
    torch.testing.assert_close(audio_logits, golden[f"{section}.forward.audio_logits"][0], **TOL)


def test_logits_rows_select_rows(lm, golden):
    length = golden["lm.both.input.audio_input_ids"].shape[1]
    rows = torch.tensor([0, length // 3, length - 1])
    text_logits, audio_logits = forward_logits(lm, golden, "lm.both", rows)
    torch.testing.assert_close(text_logits, golden["lm.both.forward.text_logits"][0][rows], **TOL)
    torch.testing.assert_close(audio_logits, golden["lm.both.forward.audio_logits"][0][rows], **TOL)


@pytest.mark.parametrize("section", SECTIONS)
def test_greedy_generation_matches_golden(lm, golden, golden_meta, golden_rules, section):
    info = golden_meta["sections"][section]
    audio_ids, text_ids, mask, features = golden_inputs(golden, section)
    result = generate_reference(
        lm,
        audio_ids,
        text_ids,
        mask,
        [features],
        SamplingParams.greedy(max_new_tokens=info["max_new_tokens"]),
        info["output_type"],
        golden_rules,
        "cpu",
        record_steps=True,
    )
    steps = result.steps
    gen = f"{section}.gen"
    assert len(steps) == info["steps_run"]
    assert [s.position for s in steps] == golden[f"{gen}.step_position_ids"].tolist()
    torch.testing.assert_close(torch.stack([s.text_logits for s in steps]), golden[f"{gen}.step_text_logits"], **TOL)
    torch.testing.assert_close(torch.stack([s.audio_logits for s in steps]), golden[f"{gen}.step_audio_logits"], **TOL)
    assert [s.sampled_text for s in steps] == golden[f"{gen}.step_sampled_text"].tolist()
    assert [s.sampled_audio for s in steps] == golden[f"{gen}.step_sampled_audio"].tolist()
    assert [s.text_token for s in steps] == golden[f"{gen}.step_text_tokens"].tolist()
    assert [s.audio_token for s in steps] == golden[f"{gen}.step_audio_tokens"].tolist()
    assert result.text_tokens == golden[f"{gen}.text_tokens"].tolist()
    assert result.audio_tokens == golden[f"{gen}.audio_tokens"].tolist()
    expected_reason = "stop" if info["steps_run"] < info["max_new_tokens"] else "length"
    assert result.finish_reason == expected_reason
    assert steps[-1].finished and not any(s.finished for s in steps[:-1])


def test_streaming_iterator_yields_the_same_steps(lm, golden, golden_meta, golden_rules):
    audio_ids, text_ids, mask, features = golden_inputs(golden, "lm.both")
    params = SamplingParams.greedy(max_new_tokens=golden_meta["sections"]["lm.both"]["max_new_tokens"])
    streamed = [
        (s.text_token, s.audio_token)
        for s in iter_reference(lm, audio_ids, text_ids, mask, features, params, "both", golden_rules)
    ]
    assert streamed == list(
        zip(golden["lm.both.gen.step_text_tokens"].tolist(), golden["lm.both.gen.step_audio_tokens"].tolist())
    )


def test_config_errors_name_the_file(golden_checkpoint, tmp_path):
    data = json.loads((golden_checkpoint / "config.json").read_text())
    hidden_size = data.pop("hidden_size")
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"config\.json.*hidden_size"):
        KimiaConfig.from_file(bad)
    data["hidden_size"] = str(hidden_size)
    bad.write_text(json.dumps(data))
    with pytest.raises(
        CheckpointError,
        match=rf"config\.json: hidden_size: expected an integer in \[1, 2147483647\], got '{hidden_size}'",
    ):
        KimiaConfig.from_file(bad)


def test_missing_tensor_is_a_checkpoint_error(golden_checkpoint, tmp_path):
    shutil.copy(golden_checkpoint / "config.json", tmp_path / "config.json")
    state = load_file(str(golden_checkpoint / "model.safetensors"))
    del state["model.mimo_norm.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*mimo_norm\.weight"):
        load_lm(CheckpointPaths(root=tmp_path, glm_tokenizer=tmp_path), "cpu", torch.float32)


def test_text_embedding_skipped_when_the_prompt_text_sums_to_zero(lm, golden, golden_rules):
    audio_ids, _, mask, features = golden_inputs(golden, "lm.both")
    zeros = torch.zeros_like(audio_ids)
    positions = torch.arange(audio_ids.shape[0])
    last = torch.tensor([audio_ids.shape[0] - 1])
    with torch.inference_mode():
        feature_positions = mask.nonzero().squeeze(1)
        skipped = lm.embed(audio_ids, zeros, torch.zeros_like(mask), features, feature_positions)
        added = lm.embed(audio_ids, zeros, torch.ones_like(mask), features, feature_positions)
        # Per-token rule: a row without use_text is the audio embedding alone.
        assert not torch.equal(skipped, added)
        torch.testing.assert_close(
            lm.embed(audio_ids[:1], zeros[:1], torch.zeros(1, dtype=torch.bool)), lm.model.embed_tokens(audio_ids[:1])
        )
        expected, _ = lm(skipped, positions, ContiguousKVCache(lm.config.num_kv_layers, "cpu", torch.float32), last)
    step = next(
        iter_reference(
            lm, audio_ids, zeros, mask, features, SamplingParams.greedy(), "both", golden_rules, record_steps=True
        )
    )
    torch.testing.assert_close(step.text_logits, expected[0], atol=1e-6, rtol=1e-6)
