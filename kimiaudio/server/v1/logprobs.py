"""OpenAI's `logprobs` object of a chat choice, from the pipeline's TokenLogprob values:
{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
"refusal": null}. `bytes` are the token's exact UTF-8 bytes (a token may hold part of a
character: its `token` text then shows U+FFFD)."""

from __future__ import annotations

from collections.abc import Iterable

from kimiaudio.pipeline.events import TokenLogprob


def _token(token_bytes: bytes, logprob: float) -> dict:
    return {"token": token_bytes.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(token_bytes)}


def logprobs_object(entries: Iterable[TokenLogprob]) -> dict:
    return {
        "content": [
            {**_token(e.token_bytes, e.logprob), "top_logprobs": [_token(b, lp) for b, lp in e.top]} for e in entries
        ],
        "refusal": None,
    }
