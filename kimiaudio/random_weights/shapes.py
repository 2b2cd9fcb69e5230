"""The sizes of every random-weight stack, one description per component.

A `StackShape` is what the config files of a random checkpoint are written from (configs.py),
and the tensors from those configs (encoders.py, lm.py, speech_output.py): the demo checkpoint on disk
is DEMO, `bench --random-weights full` builds FULL on a GPU and TINY on the CPU, and
`bench --random-weights 7b` builds FULL's LM alone. Only the sizes differ between them; the
layout, names and seeded init are the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

from kimiaudio.errors import KimiAudioError


@dataclass(frozen=True)
class LMShape:
    """MoonshotKimiaForCausalLM: the trunk, the MIMO branch from layer `mimo_from`, and where
    the speech codes start (None: right after the demo tokenizer's text and special ids)."""

    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    mimo_layers: int
    mimo_from: int
    token_offset: int | None = None
    audio_special: int = 16  # audio special ids after the codes: only named in config.json


@dataclass(frozen=True)
class WhisperShape:
    """whisper-large-v3's encoder (its decoder is never run: every shape keeps it a stub)."""

    d_model: int
    layers: int
    heads: int
    ffn: int


@dataclass(frozen=True)
class VQEncoderShape:
    """glm-4-voice-tokenizer's WhisperVQEncoder: the layers before the quantizer are the ones
    that exist (quantize_encoder_only); pooling averages `pooling` frames at that position."""

    d_model: int
    layers: int
    quantize_position: int
    heads: int
    ffn: int
    pooling: int = 4
    block: int = 200


@dataclass(frozen=True)
class DiTShape:
    hidden: int
    depth: int
    heads: int
    mlp_ratio: float


@dataclass(frozen=True)
class VocoderShape:
    """BigVGAN: the upsample rates multiply to 480 (50 Hz mels -> 24 kHz)."""

    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    channels: int
    kernels: tuple[int, ...]


@dataclass(frozen=True)
class StackShape:
    """Every component; `codes` is the GLM codebook = the LM's speech codes = the DiT's vocab."""

    name: str
    codes: int
    lm: LMShape
    whisper: WhisperShape
    glm: VQEncoderShape
    dit: DiTShape
    vocoder: VocoderShape


DEMO = StackShape(
    "demo",
    codes=256,
    lm=LMShape(hidden=128, ffn=256, layers=4, heads=4, kv_heads=2, mimo_layers=2, mimo_from=2),
    whisper=WhisperShape(d_model=64, layers=2, heads=2, ffn=128),
    glm=VQEncoderShape(d_model=64, layers=4, quantize_position=2, heads=2, ffn=128),
    dit=DiTShape(hidden=128, depth=2, heads=4, mlp_ratio=2.0),
    vocoder=VocoderShape(upsample_rates=(8, 6, 10), upsample_kernel_sizes=(16, 12, 20), channels=32, kernels=(3, 7)),
)
# moonshotai/Kimi-Audio-7B-Instruct and THUDM/glm-4-voice-tokenizer, as their configs have them.
FULL = StackShape(
    "full",
    codes=16384,
    lm=LMShape(
        hidden=3584,
        ffn=18944,
        layers=28,
        heads=28,
        kv_heads=4,
        mimo_layers=6,
        mimo_from=21,
        token_offset=152064,
        audio_special=512,
    ),
    whisper=WhisperShape(d_model=1280, layers=32, heads=20, ffn=5120),
    glm=VQEncoderShape(d_model=1280, layers=32, quantize_position=16, heads=20, ffn=5120),
    dit=DiTShape(hidden=2304, depth=16, heads=18, mlp_ratio=4.0),
    vocoder=VocoderShape(
        upsample_rates=(5, 2, 2, 2, 2, 3, 2),
        upsample_kernel_sizes=(9, 4, 4, 4, 4, 5, 4),
        channels=2048,
        kernels=(3, 5, 7, 11),
    ),
)
# FULL shrunken for the CPU: the same parts, toy widths (`bench --random-weights full` there).
TINY = StackShape(
    "tiny",
    codes=256,
    lm=LMShape(hidden=64, ffn=128, layers=3, heads=4, kv_heads=2, mimo_layers=1, mimo_from=1),
    whisper=WhisperShape(d_model=32, layers=2, heads=2, ffn=64),
    glm=VQEncoderShape(d_model=32, layers=2, quantize_position=2, heads=2, ffn=64),
    dit=DiTShape(hidden=64, depth=2, heads=4, mlp_ratio=2.0),
    vocoder=DEMO.vocoder,
)
SHAPES = {shape.name: shape for shape in (DEMO, FULL, TINY)}


def shape_named(name: str) -> StackShape:
    if name not in SHAPES:
        raise KimiAudioError(f"random stack shape {name!r}: expected one of {', '.join(SHAPES)}")
    return SHAPES[name]
