"""Voices by name: what a turn may be spoken in, as the pipeline needs it.

A Voice holds the inputs of a voice prompt (the reference at the vocoder's 24 kHz and its
12.5 Hz semantic codes from the GLM-4 tokenizer) and a key: a digest of both, so that a voice
deleted and added again under the same name is never confused with the old one on the device.
The VoiceRegistry (event loop only) maps names to voices; the server fills it from the store.
Names that are not stored but are OpenAI's stock voices (alloy, echo, ...) mean the voice of
[server] openai_voice (by default the model's own), so OpenAI's examples run unchanged; "kimi"
is the model's own voice. Any other unknown name is an error, once `fetch` has asked the
server for voices stored since it last looked (`refresh`: another instance on a shared database
may have added it a moment ago).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE
from kimiaudio.errors import KimiAudioError

MODEL_VOICE = "kimi"  # the model's own voice: what sessions report when they use none
STOCK_VOICES = frozenset(
    {
        MODEL_VOICE,
        "alloy",
        "ash",
        "ballad",
        "cedar",
        "coral",
        "echo",
        "fable",
        "marin",
        "nova",
        "onyx",
        "sage",
        "shimmer",
        "verse",
    }
)
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
NAME_RULE = "1-64 letters, digits, '_', '-' or '.', starting with a letter or digit"


class UnknownVoiceError(KimiAudioError):
    """A request named a voice that is neither stored nor a stock name."""


@dataclass(frozen=True, eq=False)
class Voice:
    name: str
    key: str  # digest of the inputs: the identity of its prefix on the device
    wav24k: np.ndarray  # float32 [samples] at 24 kHz
    codes: tuple[int, ...]  # 12.5 Hz semantic codes (no offset)
    created_at: float = 0.0

    @classmethod
    def create(cls, name: str, wav24k: np.ndarray, codes, created_at: float = 0.0) -> Voice:
        wav = np.ascontiguousarray(wav24k, dtype=np.float32).reshape(-1)
        codes = tuple(int(c) for c in codes)
        digest = hashlib.sha256(wav.tobytes() + np.asarray(codes, dtype=np.int64).tobytes()).hexdigest()[:24]
        return cls(name, digest, wav, codes, created_at)

    @property
    def seconds(self) -> float:
        return self.wav24k.size / SPEECH_OUTPUT_RATE

    def describe(self) -> dict:
        return {
            "name": self.name,
            "seconds": round(self.seconds, 3),
            "num_codes": len(self.codes),
            "created_at": self.created_at,
        }


def check_voice_name(name) -> str:
    """A stored voice's name. OpenAI's stock names may be taken (a stored "alloy" is what an
    OpenAI client asking for alloy hears); the model's own voice's may not."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise KimiAudioError(f"voice name {name!r}: expected {NAME_RULE}")
    if name.lower() == MODEL_VOICE:
        raise KimiAudioError(f"voice name {name!r}: {MODEL_VOICE!r} is the model's own voice; choose another name")
    return name


class VoiceRegistry:
    def __init__(self, default: str = "", openai_voice: str = ""):
        self.default = default  # config voices.default: the voice of requests that name none
        self.openai_voice = openai_voice  # config server.openai_voice: what OpenAI's names speak in
        self._voices: dict[str, Voice] = {}
        # Registers what was stored since the server last synced (it sets this on a database
        # shared with other instances; server/stored_voices.py).
        self.refresh: Callable[[], Awaitable[None]] | None = None

    async def fetch(self, name: object) -> None:
        """Before `resolve` of a name a client sent: a name this registry lacks may be a voice
        just stored through another instance, so `refresh` (if set) runs first."""
        if self.refresh is None or not isinstance(name, str) or not name:
            return
        if name not in self._voices and name not in STOCK_VOICES:
            await self.refresh()

    def __contains__(self, name: str) -> bool:
        return name in self._voices

    def add(self, voice: Voice) -> None:
        self._voices[voice.name] = voice

    def remove(self, name: str) -> Voice | None:
        return self._voices.pop(name, None)

    def list(self) -> list[Voice]:
        return sorted(self._voices.values(), key=lambda v: v.name)

    def resolve(self, name: str | None) -> Voice | None:
        """The voice a request names (None or "": the default); None = the model's own voice."""
        if name is not None and not isinstance(name, str):
            raise UnknownVoiceError(f"voice: expected a voice name (a string), got {name!r}")
        name = name or self.default
        if not name:
            return None
        voice = self._voices.get(name)
        if voice is None and name in STOCK_VOICES and name != MODEL_VOICE and self.openai_voice:
            return self.resolve(self.openai_voice) if self.openai_voice not in STOCK_VOICES else None
        if voice is None and name not in STOCK_VOICES:
            known = ", ".join(v.name for v in self.list()) or "none stored"
            raise UnknownVoiceError(f"unknown voice {name!r} (stored voices: {known}; add one with POST /api/voices)")
        return voice
