"""The special token ids the Kimi-Audio prompt format and generation rules use.

Follows the official `kimia_infer/utils/special_tokens.py` (ids resolved by their content
name through the tokenizer) and `tokenization_kimia.py` (the order in which the special
tokens are numbered after the BPE ranks). Every id is read from the checkpoint; nothing
here depends on the ids of one particular checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimiaudio.errors import CheckpointError

# The special tokens of the official tokenizer, in id order from the first id after the BPE
# ranks (tokenization_kimia.py `used_special_tokens`); the rest are `<|reserved_token_N|>`
# continuing at N=20 (see `official_special_names`).
OFFICIAL_USED_SPECIAL_TOKENS = (
    "[BOS]",
    "[EOS]",
    "<|im_msg_end|>",
    "<|im_user_msg_start|>",
    "<|im_assistant_msg_start|>",
    "<|reserved_token_0|>",
    "<|reserved_token_1|>",
    "<|reserved_token_2|>",
    "<|reserved_token_3|>",
    "[EOT]",
    "<|reserved_token_4|>",
    "<|reserved_token_5|>",
    "<|reserved_token_6|>",
    "<|reserved_token_7|>",
    "<|reserved_token_8|>",
    "<|reserved_token_9|>",
    "<|reserved_token_10|>",
    "<|reserved_token_11|>",
    "<|im_media_begin|>",
    "<|reserved_token_12|>",
    "<|im_media_end|>",
    "<|reserved_token_13|>",
    "<|reserved_token_14|>",
    "<|im_kimia_text_blank|>",
    "<|im_kimia_text_eos|>",
    "<|reserved_token_15|>",
    "<|reserved_token_16|>",
    "<|im_kimia_user_msg_start|>",
    "<|im_kimia_assistant_msg_start|>",
    "<|reserved_token_17|>",
    "<|reserved_token_18|>",
    "<|reserved_token_19|>",
    "<|im_kimia_speech_ct_id|>",
    "<|im_kimia_speech_ctd_id|>",
)
# The official tokenizer has 293 + 128 special tokens in all (152064 - 151643).
OFFICIAL_NUM_SPECIAL_TOKENS = 293 + 128


def official_special_names(count: int = OFFICIAL_NUM_SPECIAL_TOKENS) -> list[str]:
    """The names of the first `count` special tokens, in id order, as the official tokenizer
    numbers them: the used tokens, then reserved tokens filling up to `count`."""
    if count < len(OFFICIAL_USED_SPECIAL_TOKENS):
        raise ValueError(f"need at least {len(OFFICIAL_USED_SPECIAL_TOKENS)} special tokens, got {count}")
    reserved = [f"<|reserved_token_{i}|>" for i in range(20, 20 + count - len(OFFICIAL_USED_SPECIAL_TOKENS))]
    return list(OFFICIAL_USED_SPECIAL_TOKENS) + reserved


# field name -> token content
_FIELDS = {
    "msg_end": "<|im_msg_end|>",
    "media_begin": "<|im_media_begin|>",
    "media_end": "<|im_media_end|>",
    "text_blank": "<|im_kimia_text_blank|>",
    "text_eos": "<|im_kimia_text_eos|>",
    "user_msg_start": "<|im_kimia_user_msg_start|>",
    "assistant_msg_start": "<|im_kimia_assistant_msg_start|>",
    "speech_ct": "<|im_kimia_speech_ct_id|>",
    "speech_ctd": "<|im_kimia_speech_ctd_id|>",
}


@dataclass(frozen=True)
class SpecialTokens:
    msg_end: int
    media_begin: int
    media_end: int
    text_blank: int
    text_eos: int
    user_msg_start: int  # the kimia user start (<|im_kimia_user_msg_start|>), as the prompt uses
    assistant_msg_start: int  # the kimia assistant start, also the generation prefix
    speech_ct: int  # after the last user audio when the answer is text only
    speech_ctd: int  # after the last user audio when the answer is speech + text
    token_offset: int  # audio id = VQ code + token_offset (config kimia_token_offset)
    audio_delay: int = 6  # config kimia_mimo_audiodelaytokens: blanks before speech
    num_audio_codes: int | None = None  # vocab_size - token_offset: VQ codes are below this

    @classmethod
    def from_tokenizer(cls, tok, config: Mapping[str, Any] | Any, source: str | Path = "config.json") -> SpecialTokens:
        """Resolve every id by content through `tok` (a KimiTokenizer) and read the offsets
        from the LM config (the config.json dict, or an object with the same attributes).

        `kimia_media_begin`/`kimia_media_end` of config.json, when present, must name the same
        ids as the tokenizer: the model's forward finds media segments by these ids.
        """
        get = _getter(config)
        ids = {name: tok.special_id(content) for name, content in _FIELDS.items()}
        offset = get("kimia_token_offset")
        if not isinstance(offset, int) or offset <= 0:
            raise CheckpointError(
                f"{source}: missing or bad 'kimia_token_offset' (expected a positive integer, got {offset!r})"
            )
        if tok.vocab_size > offset:
            raise CheckpointError(
                f"{source}: kimia_token_offset={offset} is below the text vocabulary size {tok.vocab_size} "
                "of tiktoken.model + tokenizer_config.json (audio ids would collide with text ids)"
            )
        for key, name in (("kimia_media_begin", "media_begin"), ("kimia_media_end", "media_end")):
            value = get(key)
            if value is not None and value != ids[name]:
                raise CheckpointError(
                    f"{source}: {key}={value} but the tokenizer gives {_FIELDS[name]} id {ids[name]} "
                    "(config.json and tokenizer_config.json disagree)"
                )
        delay = get("kimia_mimo_audiodelaytokens")
        vocab_size = get("vocab_size")
        num_codes = vocab_size - offset if isinstance(vocab_size, int) and vocab_size > offset else None
        return cls(
            **ids, token_offset=offset, audio_delay=6 if delay is None else int(delay), num_audio_codes=num_codes
        )


def _getter(config):
    if isinstance(config, Mapping):
        return config.get
    return lambda key: getattr(config, key, None)
