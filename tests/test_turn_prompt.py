"""A conversation turn's prompt (pipeline/turn_prompt.py): the answer's room counted from the
last answer, and truncation leaving out the fewest oldest history messages ("auto": that fit;
a retention ratio: that bring it down to that share of the allowance, or of the client's
limit), never the pinned ones nor the turn. A stand-in prompt builder gives each message as many positions as its
text has characters (plus one for the generation prefix), so every length is known here."""

import pytest

from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.engine.stop_rules import BOTH_MAX_POSITIONS, TEXT_MAX_POSITIONS
from kimiaudio.pipeline.turn_prompt import Truncation, answer_params, turn_prompt
from kimiaudio.text.prompt import Message, Prompt


def build(messages) -> Prompt:
    starts, ids = [], []
    for message in messages:
        starts.append(len(ids))
        ids += [1] * len(message.text)
    ids.append(2)  # the generation prefix
    return Prompt(ids, ids, [0] * len(ids), [], starts)


def user(n: int) -> Message:
    return Message("user", "text", text="u" * n)


def assistant(n: int) -> Message:
    return Message("assistant", "text", text="a" * n)


def test_the_room_is_the_official_limit_of_the_exchange_since_the_last_answer():
    params = SamplingParams()
    first = [user(40), user(100)]  # no answer yet: one exchange, the official limit as it is
    assert answer_params(build(first), first, "both", params) is params
    talk = [user(900), assistant(700), user(100)]  # 1,701 positions: nothing left of 1,500 in all
    room = answer_params(build(talk), talk, "both", params).max_new_tokens
    assert room == BOTH_MAX_POSITIONS - 101
    assert answer_params(build(talk), talk, "text", params).max_new_tokens == TEXT_MAX_POSITIONS - 101
    own = SamplingParams(max_new_tokens=7)
    assert answer_params(build(talk), talk, "both", own) is own


def test_truncation_leaves_out_the_fewest_oldest_messages_that_make_it_fit():
    messages = [user(10), user(5000), assistant(300), user(200), assistant(100), user(50)]
    params = SamplingParams(max_new_tokens=100)
    kept = turn_prompt(messages, build, "both", params, 4096)
    assert len(kept.prompt) == 5661 and kept.num_left_out == 0  # None: the whole history, too long or not
    cut = turn_prompt(messages, build, "both", params, 4096, Truncation(pinned=1))
    assert cut.num_left_out == 1 and len(cut.prompt) == 10 + 300 + 200 + 100 + 50 + 1
    assert cut.params.max_new_tokens == 100
    tight = turn_prompt(messages, build, "both", params, 400, Truncation(1))  # 10 + 200 + 100 + 50 + 1 + 99 > 400
    assert tight.num_left_out == 3 and len(tight.prompt) == 10 + 100 + 50 + 1
    none_fit = turn_prompt(messages, build, "both", params, 100, Truncation(pinned=1))
    assert none_fit.num_left_out == 4 and len(none_fit.prompt) == 10 + 50 + 1  # the least there is


def test_the_room_kept_is_at_most_half_the_context():
    fits = [user(2000), assistant(10), user(29)]  # 2,040 positions + 2,047: the room is 7,489, but
    cut = turn_prompt(fits, build, "text", SamplingParams(), 4096, Truncation())
    assert cut.num_left_out == 0 and cut.params.max_new_tokens == TEXT_MAX_POSITIONS - 30
    longer = [user(2000), assistant(10), user(40)]  # 2,051 + 2,047 > 4,096
    cut = turn_prompt(longer, build, "text", SamplingParams(), 4096, Truncation())
    assert cut.num_left_out == 1 and len(cut.prompt) == 10 + 40 + 1


def test_a_retention_ratio_leaves_out_more_at_once_and_a_token_limit_cuts_sooner():
    messages = [user(10), user(300), assistant(300), user(200), assistant(100), user(50)]  # 961 positions
    params = SamplingParams(max_new_tokens=100)
    # The allowance after the 10 pinned positions: 1,000 - 100 + 1 - 10 = 891; 951 follow them.
    auto = turn_prompt(messages, build, "both", params, 1000, Truncation(pinned=1))
    assert auto.num_left_out == 1 and len(auto.prompt) == 10 + 300 + 200 + 100 + 50 + 1
    ratio = turn_prompt(messages, build, "both", params, 1000, Truncation(1, retention_ratio=0.5))
    assert ratio.num_left_out == 2 and len(ratio.prompt) == 10 + 200 + 100 + 50 + 1  # 351 <= 445
    fits = messages[:1] + messages[3:]  # 351 follow the pinned: within the allowance, nothing cut
    assert turn_prompt(fits, build, "both", params, 1000, Truncation(1, retention_ratio=0.5)).num_left_out == 0
    limited = Truncation(1, retention_ratio=0.8, post_instructions=300)  # 351 > 300: cut to 240 or less
    cut = turn_prompt(fits, build, "both", params, 1000, limited)
    assert cut.num_left_out == 1 and len(cut.prompt) == 10 + 100 + 50 + 1
    nothing_kept = turn_prompt(messages, build, "both", params, 1000, Truncation(1, retention_ratio=0.0))
    assert nothing_kept.num_left_out == 4 and len(nothing_kept.prompt) == 10 + 50 + 1  # the turn stays


def test_the_item_answered_is_never_cut_however_many_messages_it_is():
    # The answered item: its text (1,500) and its speech (20), two messages; the limit: 600.
    messages = [user(10), user(100), assistant(50), user(1500), user(20)]
    limited = Truncation(1, retention_ratio=0.5, post_instructions=600, tail=2)
    cut = turn_prompt(messages, build, "both", SamplingParams(max_new_tokens=100), 4096, limited)
    assert cut.num_left_out == 2 and len(cut.prompt) == 10 + 1500 + 20 + 1  # too long, but whole


@pytest.mark.parametrize(("output_type", "limit"), [("text", TEXT_MAX_POSITIONS), ("both", BOTH_MAX_POSITIONS)])
def test_before_the_first_answer_truncation_leaves_the_answer_room(output_type, limit):
    # No answer yet: the room is what the official limit leaves of the prompt, so however roomy
    # the context, a prompt past that limit has none, and each message left out gives it more.
    size = limit // 3
    messages = [user(10)] + [user(size) for _ in range(5)]
    context = 2 * limit
    assert len(build(messages)) <= context  # it fits the context, but leaves its answer nothing
    cut = turn_prompt(messages, build, output_type, SamplingParams(), context, Truncation(pinned=1))
    assert cut.num_left_out == 3 and len(cut.prompt) == len(build(messages[:1] + messages[4:]))
    assert len(cut.prompt) < limit <= len(build(messages[:1] + messages[3:]))  # one more: no room
    assert cut.params.max_new_tokens == 0  # the official limit, of the prompt as kept
    longer = [user(10)] + [user(size) for _ in range(40)]  # past the context as well
    assert turn_prompt(longer, build, output_type, SamplingParams(), context, Truncation(pinned=1)).num_left_out == 38
    fits = messages[:1] + messages[4:]
    assert turn_prompt(fits, build, output_type, SamplingParams(), context, Truncation(pinned=1)).num_left_out == 0
