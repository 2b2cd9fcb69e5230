"""Kimi-Audio text tokenizer: tiktoken BPE ranks plus the Kimi special tokens.

Follows the official `tokenization_kimia.py` (`TikTokenTokenizer`): the ranks of
`tiktoken.model` ("base64token rank" per line), special tokens numbered after the ranks, its
pre-split regex `PAT_STR`, and `encode(text, bos=False, eos=False)` with the default
`disallowed_special=()`, `allowed_special=set()`: text that looks like a special token is
encoded as plain text. The special token names come from `tokenizer_config.json`'s
`added_tokens_decoder` (as Hugging Face writes it); without it, the official numbering.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Iterator
from pathlib import Path

import tiktoken

from kimiaudio.checkpoint.files import read_json
from kimiaudio.checkpoint.paths import CheckpointPaths
from kimiaudio.errors import CheckpointError
from kimiaudio.text.special_tokens import official_special_names

# tokenization_kimia.py pat_str (note \p{N} matches single digits, unlike Llama 3's {1,3}).
PAT_STR = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tiktoken panics on very long inputs; the official encode cuts the text into pieces of at most
# this many characters, and runs of whitespace / non-whitespace into at most the second number.
_MAX_ENCODE_CHARS = 400_000
_MAX_RUN_CHARS = 25_000


class KimiTokenizer:
    def __init__(
        self,
        mergeable_ranks: dict[bytes, int],
        special_tokens: dict[str, int],
        name: str = "tiktoken.model",
        source: str | Path = "tokenizer_config.json",
    ):
        self._source = source  # named in errors about special tokens
        self._encoding = tiktoken.Encoding(
            name=name, pat_str=PAT_STR, mergeable_ranks=mergeable_ranks, special_tokens=special_tokens
        )
        self._special = dict(special_tokens)
        self._special_ids = frozenset(special_tokens.values())
        self._text_ids = frozenset(mergeable_ranks.values())  # what decode keeps
        self.num_base_tokens = len(mergeable_ranks)
        # Text ids the model may emit: ranks and specials (= kimia_token_offset on real checkpoints).
        self.vocab_size = self._encoding.max_token_value + 1

    @classmethod
    def from_checkpoint(cls, paths: CheckpointPaths) -> KimiTokenizer:
        ranks = read_tiktoken_ranks(paths.tiktoken_model)
        special = read_special_tokens(paths.tokenizer_config, ranks)
        return cls(ranks, special, name=paths.tiktoken_model.name, source=paths.tokenizer_config)

    def encode(self, text: str) -> list[int]:
        """Official `encode(text, bos=False, eos=False)`: special-token text stays plain text."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        ids: list[int] = []
        for start in range(0, len(text), _MAX_ENCODE_CHARS):
            for piece in _split_long_runs(text[start : start + _MAX_ENCODE_CHARS], _MAX_RUN_CHARS):
                ids.extend(self._encoding.encode(piece, allowed_special=set(), disallowed_special=()))
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of the BPE ids; every other id (special tokens, audio ids, unused ids) is
        dropped. Invalid UTF-8 (a cut multi-byte character) becomes U+FFFD."""
        keep = [i for i in map(int, ids) if i in self._text_ids]
        return self._encoding.decode(keep, errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one text id stands for (b"" for any other id): what OpenAI's logprobs show."""
        token_id = int(token_id)
        return self._encoding.decode_single_token_bytes(token_id) if token_id in self._text_ids else b""

    def special_id(self, content: str) -> int:
        if content not in self._special:
            raise CheckpointError(f"{self._source}: special token {content!r} not found in added_tokens_decoder")
        return self._special[content]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """Parse tiktoken.model: one "base64token rank" per non-empty line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: not a text file (expected lines 'base64token rank')") from None
    ranks: dict[bytes, int] = {}
    seen_ranks: set[int] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError("expected two fields")
            token = base64.b64decode(parts[0], validate=True)
            rank = int(parts[1])
            if rank < 0 or not token:
                raise ValueError("empty token or negative rank")
        except (ValueError, binascii.Error) as exc:
            raise CheckpointError(
                f"{path}: line {number}: expected 'base64token rank', got {line[:60]!r} ({exc})"
            ) from None
        if token in ranks or rank in seen_ranks:
            raise CheckpointError(f"{path}: line {number}: duplicate token or rank {rank}")
        ranks[token] = rank
        seen_ranks.add(rank)
    if not ranks:
        raise CheckpointError(f"{path}: no ranks found (expected lines 'base64token rank')")
    # Byte-level BPE falls back to single bytes: without one of them, encoding text that holds it
    # panics inside tiktoken (a BaseException, which would end the model worker's thread).
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise CheckpointError(
            f"{path}: {len(missing)} of the 256 single-byte tokens are missing (e.g. byte {missing[0]}): "
            "a byte-level BPE needs them all (a cut or corrupt file?)"
        )
    return ranks


def read_special_tokens(path: Path, ranks: dict[bytes, int]) -> dict[str, int]:
    """content -> id from `added_tokens_decoder` of tokenizer_config.json.

    Every id must lie above the BPE ranks (the official tokenizer numbers special tokens after
    them). Without `added_tokens_decoder`, the official names and numbering are used.
    """
    config = read_json(path)
    first_id = max(ranks.values()) + 1
    decoder = config.get("added_tokens_decoder")
    if decoder is None:
        return {name: first_id + i for i, name in enumerate(official_special_names())}
    if not isinstance(decoder, dict) or not decoder:
        raise CheckpointError(f"{path}: 'added_tokens_decoder' must be a non-empty object (id -> token)")
    special: dict[str, int] = {}
    for key, entry in decoder.items():
        content = entry.get("content") if isinstance(entry, dict) else None
        try:
            token_id = int(key)
        except ValueError:
            token_id = -1
        if token_id < first_id or not isinstance(content, str):
            raise CheckpointError(
                f"{path}: added_tokens_decoder entry {key!r}: expected an id >= {first_id} (after the "
                "tiktoken.model ranks) with a string 'content'"
            )
        if content in special:
            raise CheckpointError(f"{path}: added_tokens_decoder: {content!r} appears twice")
        special[content] = token_id
    return special


def _split_long_runs(text: str, max_run: int) -> Iterator[str]:
    """Cut `text` so that no piece holds more than `max_run` consecutive whitespace or
    consecutive non-whitespace characters (the official workaround for a tiktoken panic)."""
    start = 0
    run = 0
    in_space = text[0].isspace() if text else False
    for i, char in enumerate(text):
        if char.isspace() != in_space:
            in_space = not in_space
            run = 1
        else:
            run += 1
            if run > max_run:
                yield text[start:i]
                start = i
                run = 1
    yield text[start:]
