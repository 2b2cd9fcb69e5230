"""StreamRules: the official per-step generation rules (delay, EOS then blanks, stop tokens,
limits) on made-up ids, so nothing depends on one checkpoint's vocabulary."""

from __future__ import annotations

import pytest

from kimiaudio.engine.stop_rules import RuleTokens, StreamRules, official_codes, official_max_new_tokens
from kimiaudio.errors import KimiAudioError

TOKENS = RuleTokens(text_blank=900, text_eos=901, msg_end=902, media_end=903)
OFFSET = 1000


def _run(rules, steps):
    return [rules.step(t, a) for t, a in steps]


def test_audio_delay_forces_blanks_even_for_stop_tokens():
    rules = StreamRules("both", TOKENS, audio_delay=3, max_new_tokens=50)
    out = _run(rules, [(5, TOKENS.msg_end), (6, 1001), (7, TOKENS.media_end), (8, 1002)])
    assert [o[1] for o in out] == [900, 900, 900, 1002]
    assert not rules.is_finished
    assert rules.audio_tokens == [1002]


def test_text_eos_is_fed_once_then_blanks_and_not_counted():
    rules = StreamRules("both", TOKENS, audio_delay=0, max_new_tokens=50)
    out = _run(rules, [(5, 1001), (901, 1002), (6, 1003), (901, 1004)])
    assert [o[0] for o in out] == [5, 901, 900, 900]
    assert rules.text_tokens == [5]
    assert not rules.is_finished  # in "both" mode only the audio stream stops


def test_both_mode_stops_on_audio_end_tokens_and_keeps_the_terminator():
    for stop in (TOKENS.msg_end, TOKENS.media_end):
        rules = StreamRules("both", TOKENS, audio_delay=2, max_new_tokens=50)
        out = _run(rules, [(1, 1), (2, 1), (3, 1005), (4, 17), (5, stop)])
        assert out[-1] == (5, stop, True, "stop")
        assert rules.audio_tokens == [1005, 17, stop]
        assert official_codes(rules.audio_tokens, OFFSET) == [5]  # specials and ids below the offset dropped
        assert rules.text_tokens == [1, 2, 3, 4, 5]
        with pytest.raises(RuntimeError):
            rules.step(1, 1)


def test_text_mode_blanks_audio_and_stops_at_text_eos():
    rules = StreamRules("text", TOKENS, audio_delay=2, max_new_tokens=50)
    out = _run(rules, [(10, 1001), (11, TOKENS.msg_end), (12, 1002), (901, 1003)])
    assert [o[1] for o in out] == [900] * 4
    assert out[-1] == (901, 900, True, "stop")
    assert rules.text_tokens == [10, 11, 12] and rules.audio_tokens == []
    assert rules.text_history == [10, 11, 12, 901] and rules.audio_history == [900] * 4


def test_length_limit():
    rules = StreamRules("both", TOKENS, audio_delay=6, max_new_tokens=3)
    out = _run(rules, [(1, 1), (2, 2), (3, 3)])
    assert [o[2] for o in out] == [False, False, True]
    assert rules.finish_reason == "length" and rules.num_steps == 3
    assert StreamRules("text", TOKENS, 6, 0).is_finished


def test_ignore_eos_runs_past_every_stop_token_to_the_length_limit():
    both = StreamRules("both", TOKENS, audio_delay=0, max_new_tokens=4, ignore_eos=True)
    out = _run(both, [(901, TOKENS.msg_end), (5, TOKENS.media_end), (6, 1003), (7, 1004)])
    assert [o[2] for o in out] == [False, False, False, True]
    assert both.finish_reason == "length"
    assert [o[0] for o in out] == [901, 900, 900, 900]  # the text stream still ends at its EOS
    text = StreamRules("text", TOKENS, audio_delay=0, max_new_tokens=3, ignore_eos=True)
    assert [o[2:] for o in _run(text, [(901, 1), (5, 1), (6, 1)])] == [(False, None), (False, None), (True, "length")]


def test_official_max_new_tokens():
    assert official_max_new_tokens("both", 100) == 1400
    assert official_max_new_tokens("text", 100) == 7400
    assert official_max_new_tokens("both", 100, override=20) == 20
    with pytest.raises(KimiAudioError, match="output_type: expected 'text' or 'both', got 'audio'"):
        official_max_new_tokens("audio", 10)


def test_rule_tokens_from_any_specials_object():
    class Specials:
        text_blank, text_eos, msg_end, media_end, media_begin = 1, 2, 3, 4, 5

    assert RuleTokens.from_specials(Specials()) == RuleTokens(1, 2, 3, 4)
