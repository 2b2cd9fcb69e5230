"""Audio for the server tests: the sentences of the `speech` fixture, silence, WAV clips."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kimiaudio.audio.io import write_wav

SENTENCES = [
    "Hello, what is the weather like today?",
    "Please stop and listen to me.",
]


def silence(seconds: float, sr: int = 16000) -> np.ndarray:
    return np.zeros(int(seconds * sr), dtype=np.float32)


def write_clip(path: Path, pieces: list[np.ndarray], sr: int = 16000) -> Path:
    write_wav(path, np.concatenate(pieces), sr)
    return path
