"""Which ASR instruction a transcription's prompt holds, from the language it names.

Kimi-Audio's official prompts are a user text instruction before the audio: infer.py's
Chinese ASR_INSTRUCTION (text/prompt.py), and the official evaluation's pair (Kimi-Audio-
Evalkit): a Chinese one for Chinese audio, an English one for every other language. There is
no per-language instruction beyond these, so a `language` chooses between the two (the model
finds the language itself); no language keeps infer.py's. Language codes are Whisper's (what
OpenAI's `language` takes: ISO-639-1, as transformers' Whisper tokenizer lists them).
"""

from __future__ import annotations

from transformers.models.whisper.tokenization_whisper import LANGUAGES

from kimiaudio.errors import KimiAudioError
from kimiaudio.text.prompt import ASR_INSTRUCTION

ASR_INSTRUCTION_ZH = "请把这段语音转录成文本。"
ASR_INSTRUCTION_EN = "Please transcribe the spoken content into written text."
WHISPER_LANGUAGES: dict[str, str] = dict(LANGUAGES)  # code -> English name ("en" -> "english")


def check_language(language: str) -> str:
    """A Whisper language code (any case) -> its lower-case code; KimiAudioError otherwise."""
    code = language.strip().lower() if isinstance(language, str) else None
    if code not in WHISPER_LANGUAGES:
        raise KimiAudioError(
            f"language: expected a Whisper language code (ISO-639-1, e.g. en, zh, de), got {str(language)[:40]!r}"
        )
    return code


def asr_instruction(language: str | None) -> str:
    """The instruction for audio in `language` (a checked code; None = not said)."""
    if language is None:
        return ASR_INSTRUCTION
    return ASR_INSTRUCTION_ZH if language == "zh" else ASR_INSTRUCTION_EN
