"""The pipeline's token log-probabilities (pipeline/events.py's TokenLogprob) in OpenAI's
shapes, for every surface that reports them: a token is {"token", "logprob", "bytes"} (`bytes`
are its exact UTF-8 bytes; a token may hold part of a character, its `token` text then shows
U+FFFD), as transcriptions and Realtime input transcription report them; a chat choice's
logprobs object adds each position's alternatives: {"content": [{..., "top_logprobs": [...]}],
"refusal": null}.
"""

from __future__ import annotations

from collections.abc import Iterable

from kimiaudio.pipeline.events import TokenLogprob


def _token(token_bytes: bytes, logprob: float) -> dict:
    return {"token": token_bytes.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(token_bytes)}


def token_logprobs(entries: Iterable[TokenLogprob]) -> list[dict]:
    """[{token, logprob, bytes}]: transcriptions' logprobs."""
    return [_token(entry.token_bytes, entry.logprob) for entry in entries]


def logprobs_object(entries: Iterable[TokenLogprob]) -> dict:
    """A chat choice's logprobs, with each position's alternatives."""
    return {
        "content": [
            {**_token(entry.token_bytes, entry.logprob), "top_logprobs": [_token(b, lp) for b, lp in entry.top]}
            for entry in entries
        ],
        "refusal": None,
    }
