"""GLM-4-Voice speech tokenizer against the official goldens (tiny checkpoint)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kimiaudio.audio.glm4_tokenizer import Glm4SpeechTokenizer, _encoder_state
from kimiaudio.audio.whisper_vq_encoder import WhisperVQConfig, WhisperVQEncoder
from kimiaudio.checkpoint.paths import CheckpointPaths


@pytest.fixture(scope="module")
def glm_dir(golden_checkpoint) -> Path:
    return golden_checkpoint / "glm-4-voice-tokenizer"


@pytest.fixture(scope="module")
def tokenizer(golden_checkpoint, glm_dir):
    return Glm4SpeechTokenizer.load(CheckpointPaths(golden_checkpoint, glm_dir), "cpu")


def mel_and_mask(tokenizer, pcm: np.ndarray):
    mels = tokenizer._utterance_mels([pcm])
    mask = torch.arange(mels.shape[-1])[None] < -(-len(pcm) // tokenizer.mel.hop_length)
    return mels, mask


def test_input_features_and_mask_match_official(tokenizer, golden):
    mels, mask = mel_and_mask(tokenizer, golden["wav16k"][0].numpy())
    assert mels.shape == golden["glm4.input_features"].shape  # padded to a multiple of samples_per_token
    torch.testing.assert_close(mels, golden["glm4.input_features"], atol=1e-4, rtol=1e-4)
    assert torch.equal(mask.long(), golden["glm4.attention_mask"])


def test_hidden_state_and_tokens_match_official(tokenizer, golden):
    wav = golden["wav16k"][0].numpy()
    tokens, hidden, token_mask = tokenizer.model(*mel_and_mask(tokenizer, wav))
    torch.testing.assert_close(hidden, golden["glm4.last_hidden_state"], atol=1e-4, rtol=1e-4)
    assert tokenizer.tokenize(wav) == golden["glm4.tokens"][0].tolist()
    assert int(token_mask.sum()) == golden["glm4.tokens"].shape[1] == -(-len(wav) // tokenizer.samples_per_token)


def test_mels_match_transformers_extractor_for_multi_segment_input(tokenizer, glm_dir):
    # The official call: all 30 s segments of one utterance in one extractor batch,
    # padding="longest", pad_to_multiple_of=samples_per_token, mask every hop.
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor.from_pretrained(str(glm_dir))
    mel = tokenizer.mel
    rng = np.random.default_rng(5)
    pcm = (0.1 * rng.standard_normal(mel.segment_samples + 3333)).astype(np.float32)
    segments = [pcm[: mel.segment_samples], pcm[mel.segment_samples :]]
    ref = extractor(
        segments,
        sampling_rate=mel.sample_rate,
        return_attention_mask=True,
        return_tensors="pt",
        padding="longest",
        pad_to_multiple_of=tokenizer.samples_per_token,
    )
    mels = tokenizer._utterance_mels(segments)
    torch.testing.assert_close(mels, ref["input_features"], atol=1e-4, rtol=1e-4)
    lengths = ref["attention_mask"].sum(dim=1).tolist()
    assert lengths == [-(-len(s) // mel.hop_length) for s in segments]


def test_batch_equals_single(tokenizer, golden):
    rng = np.random.default_rng(11)
    wav = golden["wav16k"][0].numpy()
    segment, per_token = tokenizer.mel.segment_samples, tokenizer.samples_per_token
    long = (0.2 * rng.standard_normal(segment + tokenizer.mel.sample_rate)).astype(np.float32)  # 2 segments
    half = wav[: len(wav) // 2]
    inputs = [half, long, wav]
    # Also compare the pre-quantization hidden states of the valid frames (more sensitive than ids).
    captured = []
    hook = tokenizer.model.layers[-1].register_forward_hook(lambda module, args, out: captured.append(out))
    try:
        batch = tokenizer.tokenize_batch(inputs)
        batch_hidden = captured[-1]  # [segments, T, d]: rows 0, (1, 2), 3
        singles = []
        for row, pcm in zip([0, 1, 3], inputs):
            singles.append(tokenizer.tokenize(pcm))
            # conv frames of the first segment
            valid = -(-min(len(pcm), segment) // (tokenizer.mel.hop_length * tokenizer.model.frame_stride))
            torch.testing.assert_close(batch_hidden[row, :valid], captured[-1][0, :valid], atol=1e-5, rtol=1e-5)
    finally:
        hook.remove()
    assert batch == singles
    # Each 30 s segment is tokenized on its own: a full one, then the rest rounded up.
    expected = [
        -(-len(half) // per_token),
        segment // per_token - (-(len(long) - segment) // per_token),
        golden["glm4.tokens"].shape[1],
    ]
    assert [len(codes) for codes in batch] == expected
    assert all(0 <= c < tokenizer.model.config.quantize_vocab_size for codes in batch for c in codes)


def test_nearest_code_picks_first_minimum(glm_dir):
    config = WhisperVQConfig.from_file(glm_dir / "config.json")
    model = WhisperVQEncoder(config)
    with torch.no_grad():
        model.codebook.weight.zero_()
        model.codebook.weight[3] = 1.0
        model.codebook.weight[5] = 1.0  # duplicate of row 3
    x = torch.ones(1, 2, config.d_model)
    x[0, 1] = 0.0  # nearest: rows 0,1,2,4,... (all zero) -> first is 0
    assert model._nearest_code(x).tolist() == [[3, 0]]


def test_block_causal_mask():
    mask = torch.tensor([[True, True, True, True, True, False]])
    additive = WhisperVQEncoder._block_causal_mask(mask, 2, torch.float32)[0, 0]
    allowed = (additive == 0).int()
    expected = torch.tensor(
        [
            [1, 1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 0],  # key 5 is padding
            [1, 1, 1, 1, 1, 0],
        ]
    )
    assert torch.equal(allowed, expected)


def test_state_selection_accepts_prefixed_names(glm_dir):
    config = WhisperVQConfig.from_file(glm_dir / "config.json")
    last_run = config.quantize_position - 1
    state = {
        "model.encoder.conv1.weight": torch.zeros(1),
        f"model.encoder.layers.{last_run}.fc1.weight": torch.zeros(1),
        f"model.encoder.layers.{last_run + 1}.fc1.weight": torch.zeros(1),  # >= quantize_position: dropped
        "model.encoder.layer_norm.weight": torch.zeros(1),
        "model.encoder.ema_count": torch.zeros(1),
        "model.decoder.embed_tokens.weight": torch.zeros(1),
    }
    assert sorted(_encoder_state(state, config)) == ["conv1.weight", f"layers.{last_run}.fc1.weight"]
