"""A golden checkpoint's text side for the prompt tests: its tokenizer and its special token ids
(read as the project reads a real checkpoint's)."""

from __future__ import annotations

from kimiaudio.checkpoint.files import read_json
from kimiaudio.text.special_tokens import SpecialTokens
from kimiaudio.text.tokenizer import KimiTokenizer


def golden_text(golden_paths) -> tuple[KimiTokenizer, SpecialTokens]:
    tok = KimiTokenizer.from_checkpoint(golden_paths)
    return tok, SpecialTokens.from_tokenizer(tok, read_json(golden_paths.lm_config))
