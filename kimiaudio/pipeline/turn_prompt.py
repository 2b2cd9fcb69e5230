"""The prompt of one turn of a conversation as the LM worker submits it: the room its answer
gets, and, under truncation, the oldest turns left out when the conversation has outgrown
engine.max_model_len (or a client's own limit).

The room. The official limit (engine/stop_rules.py) is that of one exchange: 1500 positions
for a spoken answer (120 s of speech), 7500 for a text answer, the prompt included. A
conversation counts only what came after its last answer, so its tenth answer gets the room
its first one got, not what 1500 positions leave after the whole history (nothing, a few
minutes into a talk). A prompt with no answer in it is one exchange: its limit is the
official one exactly. A request's own max_new_tokens replaces either.

Truncation (a Realtime session's; OpenAI's: "messages, starting from the oldest, will not be
included in the model's context"). A prompt is kept only if its answer has room: at least one
position, counted as above for the prompt as kept (with no answer in it, the official limit
less the kept prompt, so that each message left out gives the answer more; a prompt past the
official limit has none). What follows the first `pinned` messages (the session's
instructions) may then use what that room (at most half of engine.max_model_len) leaves of
engine.max_model_len, or a client's `post_instructions` limit where that is less. Past it, the
fewest oldest history messages are left out that bring it down to `retention_ratio` of that
allowance: 1.0 is OpenAI's "auto" (just fit); less drops more at once, so that the next turns
fit without dropping again, and keep the prefix cache's hits. Neither the pinned messages nor
the turn being answered (its last `tail` messages: a user item of text and speech is two) are
ever left out. Even with all of the others left out, the turn may not fit: the engine then
refuses it as too long (context_length_exceeded), as it refuses any prompt without truncation
("disabled"), or its answer ends at once for want of room, as the official code's does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.engine.stop_rules import official_max_new_tokens
from kimiaudio.text.prompt import Message, Prompt


@dataclass(frozen=True)
class Truncation:
    """How a turn's history may be cut (OpenAI's "auto", or "retention_ratio")."""

    pinned: int = 0  # the leading messages never left out (the instructions)
    retention_ratio: float = 1.0  # of the allowance, kept when cutting (1.0: "auto")
    post_instructions: int | None = None  # the client's limit on what follows the pinned messages
    tail: int = 1  # the last messages never left out (the turn answered)


class TurnPrompt(NamedTuple):
    prompt: Prompt
    params: SamplingParams  # with the answer's room as max_new_tokens, where it is not the official one
    num_left_out: int  # history messages truncation left out


def answer_params(
    prompt: Prompt, messages: Sequence[Message], output_type: str, params: SamplingParams
) -> SamplingParams:
    """`params` with the answer's room: the request's own max_new_tokens, else the official
    limit of what came after the prompt's last answer (a prompt with none: as they are)."""
    answers = [index for index, message in enumerate(messages) if message.role == "assistant"]
    if params.max_new_tokens > 0 or not answers or answers[-1] + 1 == len(messages):
        return params
    since = prompt.message_starts[answers[-1] + 1]
    room = official_max_new_tokens(output_type, len(prompt) - since)
    return dataclasses.replace(params, max_new_tokens=max(1, room))


def turn_prompt(
    messages: Sequence[Message],
    build: Callable[[Sequence[Message]], Prompt],
    output_type: str,
    params: SamplingParams,
    max_model_len: int,
    truncation: Truncation | None = None,
) -> TurnPrompt:
    """The prompt of `messages` (the last one the turn answered) and its params; truncation None
    keeps the whole history."""
    prompt = build(messages)
    params = answer_params(prompt, messages, output_type, params)
    if truncation is None:
        return TurnPrompt(prompt, params, 0)
    pinned = truncation.pinned
    pinned_len = prompt.message_starts[pinned] if pinned < len(messages) else len(prompt)

    def fits(candidate: Prompt, share: float) -> bool:
        """Whether `candidate` leaves its answer room, and what follows its pinned messages is
        within `share` of the allowance that room leaves."""
        # Counted for the candidate: with no answer in it, its room is what the official limit
        # leaves of it, which leaving out messages raises; past that limit it has none (a room
        # below zero would widen the allowance, not shrink it).
        room = official_max_new_tokens(output_type, len(candidate), params.max_new_tokens)
        if room < 1:
            return False
        allowance = max_model_len - min(room, max_model_len // 2) + 1 - pinned_len
        if truncation.post_instructions is not None:
            allowance = min(allowance, truncation.post_instructions)
        return len(candidate) - pinned_len <= int(allowance * share)

    if fits(prompt, 1.0):
        return TurnPrompt(prompt, params, 0)
    kept, droppable = list(messages[:pinned]), len(messages) - truncation.tail - pinned
    # The fewest left out that fit: a prompt only shrinks as more are left out, and the allowance
    # shrinks by less (what its answer's room grows by, at most what the prompt lost).
    low, high, best = 1, droppable, None
    while low <= high:
        middle = (low + high) // 2
        candidate = build(kept + list(messages[pinned + middle :]))
        if fits(candidate, truncation.retention_ratio):
            best, high = (middle, candidate), middle - 1
        else:
            low = middle + 1
    if best is None and droppable > 0:  # nothing fits: the least there is
        best = droppable, build(kept + list(messages[-truncation.tail :]))
    left_out, prompt = best if best is not None else (0, prompt)
    return TurnPrompt(prompt, params, left_out)
