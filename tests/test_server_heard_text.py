"""HeardText, the text a spoken answer cut short keeps (server/session/heard_text.py), on the demo
checkpoint's tokenizer and special tokens: the text tokens of the positions up to the last code
heard (the audio delay's, then one per code heard), decoded as the pipeline decodes an answer.
The realtime tests (test_v1_realtime_heard.py) check the rule on what a real answer stores; the
demo's random weights end their text within the audio delay, so the text itself being cut is
checked here, on streams laid out as the model generates them."""

import pytest

from kimiaudio.server.session.heard_text import HeardText

from helpers.demo_server import demo_stack


@pytest.fixture(scope="module")
def heard_text(demo_checkpoint) -> HeardText:
    stack = demo_stack(demo_checkpoint)
    return HeardText(stack.tokenizer, stack.specials)


def stream(heard_text: HeardText, text: str, length: int) -> list[int]:
    """An answer's text stream: its text's tokens, the text EOS, then blanks to `length` positions."""
    specials = heard_text.specials
    tokens = heard_text.tokenizer.encode(text) + [specials.text_eos]
    return tokens + [specials.text_blank] * (length - len(tokens))


def test_the_text_of_the_positions_heard_is_kept(heard_text):
    text = "Once upon a time, a story began."
    tokens = stream(heard_text, text, 60)
    delay = heard_text.specials.audio_delay
    assert (heard_text.positions(0), heard_text.positions(1), heard_text.positions(4)) == (0, delay + 1, delay + 4)
    assert heard_text.cut(text, tokens, 0) == ("", [])  # nothing heard, nothing kept
    for codes in range(1, 60 - delay + 1):
        kept_text, kept = heard_text.cut(text, tokens, codes)
        assert kept == tokens[: delay + codes]
        assert kept_text == heard_text.tokenizer.decode(tokens[: delay + codes])
    assert heard_text.cut(text, tokens, 2)[0] == "Once upo"  # (the demo's tokens are bytes)
    assert heard_text.cut(text, tokens, 60 - delay) == (text, tokens)  # all of it heard


def test_what_is_no_text_is_left_out(heard_text):
    """Blanks, audio ids in the text stream, a character split by the cut, anything after the
    text EOS."""
    specials = heard_text.specials
    text = "été"
    ids = heard_text.tokenizer.encode(text)
    assert len(ids) == 5  # (each é is two bytes)
    before = [specials.text_blank] * (specials.audio_delay - 1) + [specials.token_offset + 5]
    tokens = before + ids + [specials.text_eos] + heard_text.tokenizer.encode("not said") + [specials.text_blank] * 8
    kept = [heard_text.cut(text, tokens, codes)[0] for codes in range(1, 8)]
    assert kept == ["", "é", "ét", "ét", "été", "été", "été"]


def test_a_stop_string_ends_the_text_kept_where_it_ended_the_text_sent(heard_text):
    text = "Hello there, general Kenobi"
    tokens = stream(heard_text, text, 80)
    sent = "Hello there"  # the request's stop string ", " ended what was sent
    assert heard_text.cut(sent, tokens, 80 - heard_text.specials.audio_delay)[0] == sent
    assert heard_text.cut(sent, tokens, 2)[0] == "Hello th"
