"""A ModelStack with random weights, for the full-size bench (no weight files).

`build_random_stack(config, "full")` builds every part of Kimi-Audio-7B-Instruct in its real
shapes (docs/official-model.md; random_weights/shapes.py FULL): the Whisper-large-v3 encoder, the GLM-4-Voice
tokenizer's WhisperVQEncoder (float32, as official), the 7B LM, the detokenizer's DiT and the
BigVGAN vocoder; "tiny" builds the same parts at toy sizes, so the CPU tests keep it working.
The parts come from random_weights.modules: the configs and seeded tensors the demo checkpoint
is written from, drawn on the target device (no CPU copy of the weights). The text tokenizer
and its special tokens come from the demo checkpoint (written once under the data dir); the
returned ModelStack is what the pipeline runs.

Random weights would sample speech codes rarely (they are 16,384 of 168,448 ids), so the rows
of `mimo_output` that are not speech codes are zero: every audio step yields a code, as a real
reply does (and msg_end never comes: turns end at their max_new_tokens).
"""

from __future__ import annotations

import time

import torch

from kimiaudio.checkpoint.paths import find_checkpoint, resolve_device, resolve_dtype
from kimiaudio.config import Config, served_detok
from kimiaudio.detok.detokenizer import Detokenizer
from kimiaudio.layers.attention import pin_sdpa_backends
from kimiaudio.layers.fp8 import require_fp8
from kimiaudio.layers.precision import exact_float32
from kimiaudio.models.quantize import quantize_dit
from kimiaudio.random_weights.modules import RandomParts
from kimiaudio.random_weights.shapes import shape_named


def build_random_stack(config: Config, shape: str = "full", seed: int = 0):
    """A pipeline.model_stack.ModelStack with random weights in `shape` (a name of
    random_weights.shapes.SHAPES) on config.model.device / dtype (the GLM encoder in float32)."""
    from kimiaudio.pipeline.model_stack import ModelStack
    from kimiaudio.random_weights.demo_checkpoint import ensure_demo_checkpoint
    from kimiaudio.text.special_tokens import SpecialTokens
    from kimiaudio.text.tokenizer import KimiTokenizer

    sizes = shape_named(shape)
    device = resolve_device(config.model.device)
    dtype = resolve_dtype(config.model.dtype, device)
    exact_float32(device, dtype)
    pin_sdpa_backends(device)
    paths = find_checkpoint(ensure_demo_checkpoint(config.data_dir))  # its tokenizer and special tokens
    tokenizer = KimiTokenizer.from_checkpoint(paths)
    parts = RandomParts(sizes, device, dtype, seed)
    seconds: dict[str, float] = {}

    def timed(name, build):
        start = time.perf_counter()
        part = build()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds[name] = time.perf_counter() - start
        return part

    specials = SpecialTokens.from_tokenizer(tokenizer, parts.lm_config, source=f"random-weights-{shape}")
    # --weights fp8 / int8 quantize the parts as a loaded checkpoint's are; auto keeps them as drawn.
    lm_weights, dit_weights = (
        w if w in ("fp8", "int8") else "bf16" for w in (config.model.weights, config.detok.weights)
    )
    for key, value in (("model.weights", lm_weights), ("detok.weights", dit_weights)):
        if value == "fp8":
            require_fp8(device, key)
    lm = timed("lm", lambda: _speech_head_only(parts.lm(lm_weights), parts.lm_config["kimia_token_offset"]))
    whisper = timed("whisper", parts.whisper)
    glm4 = timed("glm4_tokenizer", parts.glm4)
    detok = None
    if not config.model.text_only:
        detok = timed(
            "detokenizer",
            lambda: Detokenizer(quantize_dit(parts.dit(), dit_weights), parts.vocoder(), served_detok(config)),
        )
    return ModelStack(config, paths, device, dtype, tokenizer, specials, lm, whisper, glm4, detok, seconds)


@torch.no_grad()
def _speech_head_only(lm, offset: int):
    lm.mimo_output.weight[:offset].zero_()  # audio logits: 0 for non-code ids, random for codes
    return lm
