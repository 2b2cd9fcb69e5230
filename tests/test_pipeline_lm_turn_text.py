"""A turn's text on the LM worker (pipeline/lm_turn.py) with the golden checkpoint's real
tokenizer: stop strings cut the text where the first begins and end the turn, text that may
start one is held back until it cannot, and the tokens' log-probabilities go with the text."""

import asyncio

import numpy as np
import pytest

from kimiaudio.pipeline.lm_turn import LmTurn
from kimiaudio.pipeline.turn_handle import TurnHandle
from kimiaudio.pipeline.turn_request import TurnRequest
from kimiaudio.text.tokenizer import KimiTokenizer

OFFSET, EOS = 10**6, 10**6 - 1  # above every text id: no generated text id is taken for either


@pytest.fixture(scope="module")
def tok(golden_paths):
    return KimiTokenizer.from_checkpoint(golden_paths)


def run(tok, text: str | list[int], stop=(), logprobs=False):
    """Feed `text`'s ids (or these ids) one step at a time -> (deltas, the turn)."""
    request = TurnRequest("c", [], np.zeros(16000, np.float32), output_type="text", stop=tuple(stop), logprobs=logprobs)
    loop = asyncio.new_event_loop()  # the handle's; nothing is delivered to it here
    turn = LmTurn(TurnHandle("t", loop), request, {}, 0.0)
    loop.close()
    turn.start(OFFSET, EOS, False)
    deltas = []
    ids = tok.encode(text) if isinstance(text, str) else text
    for i, token in enumerate(ids):
        turn.add_tokens(token, None, -0.5 - i, ((token, -0.5 - i),))
        delta = turn.text_delta(tok, final=i == len(ids) - 1)
        if delta is not None:
            deltas.append(delta)
        if turn.stopped:
            break
    return deltas, turn


def test_a_stop_string_cuts_the_text_and_ends_the_turn(tok):
    deltas, turn = run(tok, "hello world, and more after it", stop=["o w", "never"])
    assert "".join(d.text for d in deltas) == turn.emitted_text == "hell"
    assert turn.stopped and len(turn.text_ids) < len(tok.encode("hello world, and more after it"))


def test_text_that_may_begin_a_stop_string_is_held_back(tok):
    deltas, turn = run(tok, "abcabd", stop=["abd"])
    assert turn.stopped and turn.emitted_text == "abc"
    assert all("abd" not in d.text for d in deltas)
    deltas, turn = run(tok, "abcab", stop=["abd"])  # never completed: all of it, at the end
    assert not turn.stopped and "".join(d.text for d in deltas) == "abcab"


def test_logprobs_follow_the_text_up_to_the_stop(tok):
    deltas, turn = run(tok, "hello world", logprobs=True)
    entries = [e for d in deltas for e in d.logprobs]
    assert b"".join(e.token_bytes for e in entries).decode() == "hello world" and entries == turn.logprobs
    assert [e.logprob for e in entries] == [-0.5 - i for i in range(len(entries))]
    assert entries[0].top == ((entries[0].token_bytes, -0.5),)
    _, stopped = run(tok, "hello world", stop=["world"], logprobs=True)
    assert b"".join(e.token_bytes for e in stopped.logprobs).decode().startswith("hello")
    assert len(stopped.logprobs) < len(entries)
    assert run(tok, "hello")[1].logprobs == []  # not asked for


def test_logprobs_after_a_stop_follow_text_of_split_and_invalid_bytes(tok):
    """Byte tokens: a character split over three tokens is kept whole up to a stop right after
    it; bytes that are no UTF-8 (one U+FFFD in the text for two bytes) keep exactly their
    tokens, not the next one."""
    byte = [tok._encoding.encode_single_token(bytes([b])) for b in range(256)]
    split = [byte[ord("a")], *(byte[b] for b in "中".encode()), byte[ord(" ")], byte[ord("b")]]
    _, turn = run(tok, split, stop=[" "], logprobs=True)
    assert turn.emitted_text == "a中" and [e.token_bytes for e in turn.logprobs] == [b"a", b"\xe4", b"\xb8", b"\xad"]
    invalid = [byte[ord("a")], byte[0xE4], byte[0xB8], byte[ord("4")], byte[ord("b")]]
    _, turn = run(tok, invalid, stop=["4"], logprobs=True)
    assert turn.emitted_text == "a\ufffd" and [e.token_bytes for e in turn.logprobs] == [b"a", b"\xe4", b"\xb8"]
