"""The loaded model stack: tokenizer, speech encoders, LM and (unless text-only) detokenizer.

`ModelStack.load(config)` resolves the checkpoint (a configured directory, or the embedded
demo checkpoint created once under the data dir), validates its files and loads every part
through the same loaders whatever the checkpoint. It is the one place that knows which part
lives in which file; the CLI, the pipeline and the server only hold a ModelStack.
"""

from __future__ import annotations

import atexit
import gc
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from kimiaudio.audio.device_result import DeviceResult, compute_now
from kimiaudio.audio.staged_work import Stages
from kimiaudio.checkpoint.files import read_json
from kimiaudio.checkpoint.paths import CheckpointPaths, find_checkpoint, resolve_device, resolve_dtype
from kimiaudio.config import Config, served_detok
from kimiaudio.layers.attention import pin_sdpa_backends
from kimiaudio.layers.precision import exact_float32
from kimiaudio.pipeline.encode_cache import Encoded

if TYPE_CHECKING:
    # For the annotations only: `_load` imports the parts itself, inside the load's pause of the
    # garbage collector (the imports are much of what it allocates), and a text-only stack never
    # imports the detokenizer.
    from kimiaudio.audio.glm4_tokenizer import Glm4SpeechTokenizer
    from kimiaudio.audio.whisper_features import WhisperFeatureEncoder
    from kimiaudio.detok.detokenizer import Detokenizer
    from kimiaudio.models.kimia_config import KimiaConfig
    from kimiaudio.models.kimia_lm import KimiAudioLM
    from kimiaudio.text.special_tokens import SpecialTokens
    from kimiaudio.text.tokenizer import KimiTokenizer

log = logging.getLogger(__name__)

DEMO_NOTICE = (
    "DEMO WEIGHTS: the embedded tiny checkpoint has random weights, so its speech is noise and its "
    "text is gibberish. For real answers download moonshotai/Kimi-Audio-7B-Instruct and "
    "THUDM/glm-4-voice-tokenizer and start with --model DIR (or set [model] path in config.toml)."
)


@dataclass
class ModelStack:
    config: Config
    paths: CheckpointPaths
    device: torch.device
    dtype: torch.dtype
    tokenizer: KimiTokenizer
    specials: SpecialTokens
    lm: KimiAudioLM
    whisper: WhisperFeatureEncoder
    glm4: Glm4SpeechTokenizer
    detokenizer: Detokenizer | None  # None for a text-only stack
    load_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def is_demo(self) -> bool:
        return self.paths.is_demo

    @property
    def lm_config(self) -> KimiaConfig:
        return self.lm.config

    @classmethod
    def load(cls, config: Config, progress: bool = False, text_only: bool | None = None) -> ModelStack:
        # Loading allocates hundreds of thousands of long-lived objects (imports, modules) and
        # no garbage cycles worth finding: the collector's repeated passes over them are a
        # large part of the demo's start-up. Paused for the load only.
        enabled = gc.isenabled()
        gc.disable()
        try:
            return cls._load(config, progress, text_only)
        finally:
            if enabled:
                gc.enable()

    @classmethod
    def _load(cls, config: Config, progress: bool, text_only: bool | None) -> ModelStack:
        from kimiaudio.audio.glm4_tokenizer import Glm4SpeechTokenizer
        from kimiaudio.audio.whisper_features import WhisperFeatureEncoder
        from kimiaudio.models.kimia_lm import load_lm
        from kimiaudio.text.special_tokens import SpecialTokens
        from kimiaudio.text.tokenizer import KimiTokenizer

        text_only = config.model.text_only if text_only is None else text_only
        paths = resolve_checkpoint(config, text_only)
        device = resolve_device(config.model.device)
        dtype = resolve_dtype(config.model.dtype, device)
        exact_float32(device, dtype)
        pin_sdpa_backends(device)
        if paths.is_demo:
            log.warning(DEMO_NOTICE)
        from kimiaudio.pipeline.weights_choice import resolve_weights

        lm_weights, dit_weights = resolve_weights(config, paths, device, dtype, text_only)
        seconds: dict[str, float] = {}

        def timed(name, fn):
            start = time.perf_counter()
            value = fn()
            seconds[name] = time.perf_counter() - start
            return value

        tokenizer = timed("tokenizer", lambda: KimiTokenizer.from_checkpoint(paths))
        specials = SpecialTokens.from_tokenizer(tokenizer, read_json(paths.lm_config))
        lm = timed("lm", lambda: load_lm(paths, device, dtype, progress=progress, weights=lm_weights))
        whisper = timed("whisper", lambda: WhisperFeatureEncoder.load(paths, device, dtype))
        glm4 = timed("glm4_tokenizer", lambda: Glm4SpeechTokenizer.load(paths, device))
        detok = None
        if not text_only:
            from kimiaudio.detok.detokenizer import Detokenizer

            detok = timed(
                "detokenizer", lambda: Detokenizer.load(paths, device, dtype, served_detok(config), weights=dit_weights)
            )
        return cls(config, paths, device, dtype, tokenizer, specials, lm, whisper, glm4, detok, seconds)

    def encode_speech(self, pcm16k: np.ndarray) -> tuple[list[int], torch.Tensor]:
        """One utterance -> (VQ codes without offset, Whisper features [T, adaptor_dim] on the host)."""
        tokens, features = self.encode_speech_batch([pcm16k])[0]
        return tokens, features

    def encode_speech_batch(self, pcms: list[np.ndarray]) -> list[Encoded]:
        """Several utterances in one batch per encoder; equal to encoding them one by one."""
        return compute_now(self.encode_speech_stages(pcms))

    def encode_speech_stages(self, pcms: list[np.ndarray]) -> Stages[DeviceResult[list[Encoded]]]:
        """`encode_speech_batch` in stages (audio/staged_work.py): each encoder's log-mel and
        layers; the result stays on the device until copied (audio/device_result.py). The
        Whisper window follows [audio] whisper_window (official: the 30 s window)."""
        codes = yield from self.glm4.tokenize_batch_stages(pcms)
        exact = self.config.audio.whisper_window == "official"
        features = yield from self.whisper.features_batch_stages(pcms, exact)
        return DeviceResult.join(codes, features, _aligned)


def _aligned(token_lists: list[list[int]], feature_list: list[torch.Tensor]) -> list[Encoded]:
    """Both encoders yield ceil(samples/1280) positions; keep them aligned if a rounding edge
    ever disagrees, since each code position needs exactly one feature row."""
    out = []
    for tokens, features in zip(token_lists, feature_list):
        n = min(len(tokens), features.shape[0])
        out.append((list(tokens[:n]), features[:n]))
    return out


def freeze_loaded_objects() -> None:
    """Once the models are loaded, before serving: take every object alive now (imported
    libraries, modules, tokenizer tables: about 350k) out of the garbage collector's scans.
    A full collection over them took 0.21 s on the demo stack and lands at random on the worker
    thread; afterwards it scans only what serving allocates. Call once per process.

    They are handed back to the collector at exit (atexit runs before the interpreter's last
    collection): a frozen object is never collected, not even then, and Triton's reference
    cycles (ir objects of its nanobind extension, made when it is imported) would outlive the
    interpreter; nanobind's check at exit then prints "nanobind: leaked ..." for each of them
    and every type and function of the extension, some 30 lines after a bench or `serve`."""
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # once, however often it is called
    atexit.register(gc.unfreeze)


def resolve_checkpoint(config: Config, text_only: bool = False) -> CheckpointPaths:
    """The configured checkpoint, or the demo checkpoint (written once under the data dir)."""
    if config.model.path:
        model_dir = config.resolve(config.model.path)
    else:
        from kimiaudio.random_weights.demo_checkpoint import ensure_demo_checkpoint

        model_dir = ensure_demo_checkpoint(config.data_dir)
    glm = config.resolve(config.model.glm_tokenizer_path) if config.model.glm_tokenizer_path else None
    return find_checkpoint(Path(model_dir), glm, text_only=text_only)
