"""The speech encoders' device path (skipped without a GPU; KIMIAUDIO_TEST_DEVICE=cpu runs the
parts that mean something on the CPU): the log-mel on the device against the official one,
and the LM worker's encoding on its own CUDA stream against the one-call encoders, results
released batch by batch, the caller's stream untouched."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from kimiaudio.audio.log_mel import MelSettings, log_mel_spectrogram, padded_waveforms
from kimiaudio.checkpoint.files import read_json
from kimiaudio.config import load_config
from kimiaudio.pipeline.lm_turn import LmTurn
from kimiaudio.pipeline.metrics import PipelineMetrics
from kimiaudio.pipeline.model_stack import ModelStack
from kimiaudio.pipeline.speech_encoding import SpeechEncoding

DEVICE = torch.device(os.environ.get("KIMIAUDIO_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(
    DEVICE.type == "cuda" and not torch.cuda.is_available(),
    reason="needs a CUDA GPU (KIMIAUDIO_TEST_DEVICE=cpu runs these on the CPU)",
)


def test_log_mel_on_the_device_matches_the_official_one(golden, golden_checkpoint):
    directory = golden_checkpoint / "whisper-large-v3"
    settings = MelSettings.from_preprocessor_config(
        directory / "preprocessor_config.json", read_json(directory / "config.json")["num_mel_bins"]
    )
    wav = golden["wav16k"][0].numpy()
    waveforms = padded_waveforms([wav], settings.segment_samples, DEVICE)  # pad_or_trim, on the device
    mel = log_mel_spectrogram(waveforms, settings.filters().to(DEVICE), settings)[0].cpu()
    torch.testing.assert_close(mel, golden["whisper.mel"], atol=1e-4, rtol=1e-4)


def test_encoding_on_its_own_stream_equals_the_one_call_encoders(demo_checkpoint):
    config = load_config(None, {"model": {"path": str(demo_checkpoint), "device": str(DEVICE)}})
    stack = ModelStack.load(config, text_only=True)
    rng = np.random.default_rng(3)
    pcms = [(0.1 * rng.standard_normal(16000 + 3000 * i)).astype(np.float32) for i in range(5)]
    expected = stack.encode_speech_batch(pcms)
    encoding = SpeechEncoding(stack, batch_size=2, metrics=PipelineMetrics())
    turns = [LmTurn(None, None, {bytes([i]): pcm}, 0.0) for i, pcm in enumerate(pcms)]
    caller = torch.cuda.current_stream(DEVICE) if DEVICE.type == "cuda" else None
    released: list[list[int]] = []
    for _ in range(10_000):
        assert encoding.advance(turns, float("inf")) == []
        done = [i for i, turn in enumerate(turns) if not turn.missing]
        if done != (released[-1] if released else []):
            released.append(done)
        if len(done) == len(turns):
            break
        if caller is not None:
            assert torch.cuda.current_stream(DEVICE) == caller  # the encoder stream was only borrowed
            torch.cuda.synchronize(DEVICE)  # a test may wait; the worker polls instead
    # Batch by batch (at most two utterances each), oldest first.
    assert released[0] in ([0], [0, 1]) and released[-1] == [0, 1, 2, 3, 4]
    for turn, (codes, features), i in zip(turns, expected, range(len(pcms))):
        got_codes, got_features = turn.encoded[bytes([i])]
        assert got_codes == codes and got_features.device.type == "cpu"
        torch.testing.assert_close(got_features, features, atol=1e-5, rtol=1e-5)
