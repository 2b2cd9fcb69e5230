"""The two kinds of answer, defined once: "text" (a text answer) or "both" (speech with its
transcript), as the official prompt (prompt.py) and stop rules (engine/stop_rules.py) tell them
apart, and how OpenAI's `modalities` name them.
"""

from __future__ import annotations

from typing import Any

from kimiaudio.errors import KimiAudioError

TEXT = "text"
BOTH = "both"
OUTPUT_TYPES = (TEXT, BOTH)
# OpenAI's modalities (chat completions' `modalities`, the Realtime API's `modalities` or
# `output_modalities`), as a sorted set, and the output type each asks for.
MODALITIES = {("text",): TEXT, ("audio",): BOTH, ("audio", "text"): BOTH}
EXPECTED_MODALITIES = '["text"] or ["text", "audio"]'
EXPECTED_OUTPUT_MODALITIES = '["audio"] or ["text"]'  # the GA Realtime API's `output_modalities`


def check_output_type(value: Any, where: str = "output_type", error: type[KimiAudioError] = KimiAudioError) -> str:
    """`value` if it is an output type, else an `error` naming `where`."""
    if value not in OUTPUT_TYPES:
        raise error(f"{where}: expected 'text' or 'both', got {value!r}"[:200])
    return value


def output_type_of(modalities: Any) -> str | None:
    """The output type a list of OpenAI modalities asks for; None when it is no such list."""
    if not isinstance(modalities, list) or not all(isinstance(m, str) for m in modalities):
        return None
    return MODALITIES.get(tuple(sorted(set(modalities))))


def modalities_of(output_type: str) -> list[str]:
    """OpenAI's modalities of an output type (as the session object reports them)."""
    return ["text", "audio"] if output_type == BOTH else ["text"]
