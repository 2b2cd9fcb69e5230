"""Speech for the benches and tests: a synthetic voiced signal (no dependencies) and real
sentences spoken by espeak-ng."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.errors import KimiAudioError


def synthetic_speech(seconds: float, seed: int, sr: int = SPEECH_INPUT_RATE) -> np.ndarray:
    """A voiced, speech-like signal: a glottal-pulse harmonic series with a wandering pitch
    and syllable-rate amplitude envelope (distinct per seed, so encoders see real variety)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    f0 = 110 + 40 * rng.random() + 20 * np.sin(2 * np.pi * 0.7 * t + rng.random() * 6)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voice = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = np.clip(np.sin(2 * np.pi * 3.5 * t + rng.random() * 6), 0, None) ** 0.5
    pcm = 0.3 * voice * envelope / np.max(np.abs(voice)) + 0.003 * rng.standard_normal(t.size)
    return pcm.astype(np.float32)


def espeak_speech(texts: list[str], directory: Path) -> list[np.ndarray]:
    """`texts` spoken by espeak-ng (a Debian package), as float32 16 kHz (load_audio resamples)."""
    from kimiaudio.audio.io import load_audio

    if shutil.which("espeak-ng") is None:
        raise KimiAudioError("bench --webrtc needs speech: install espeak-ng or pass --speech FILE")
    clips = []
    for i, text in enumerate(texts):
        path = directory / f"speech{i}.wav"
        subprocess.run(["espeak-ng", "-s", "150", "-w", str(path), text], check=True, capture_output=True)
        clips.append(load_audio(path))
    return clips
