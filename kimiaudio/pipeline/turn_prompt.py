"""The prompt of one turn of a conversation as the LM worker submits it: the room its answer
gets, and, under truncation "auto", the oldest turns left out when the conversation has
outgrown engine.max_model_len.

The room. The official limit (engine/stop_rules.py) is that of one exchange: 1500 positions
for a spoken answer (120 s of speech), 7500 for a text answer, the prompt included. A
conversation counts only what came after its last answer, so its tenth answer gets the room
its first one got, not what 1500 positions leave after the whole history (nothing, a few
minutes into a talk). A prompt with no answer in it is one exchange: its limit is the
official one exactly. A request's own max_new_tokens replaces either.

Truncation "auto" (a Realtime session's; OpenAI's: "messages, starting from the oldest, will
not be included in the model's context"): when the prompt and its answer's room (at most half
of engine.max_model_len) do not fit engine.max_model_len, the fewest oldest history messages are
left out that make them fit, never the first `pinned` (the session's instructions) nor the
turn being answered. Even with all of them left out, the turn may not fit: the engine then
refuses it as too long (context_length_exceeded), as it refuses any prompt without truncation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.engine.stop_rules import official_max_new_tokens
from kimiaudio.text.prompt import Message, Prompt


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
    truncate_after: int | None = None,
) -> TurnPrompt:
    """The prompt of `messages` (the last one the turn answered) and its params; truncate_after:
    None, the whole history is kept; else truncation "auto", the history after the first
    `truncate_after` messages may be left out, oldest first."""
    prompt = build(messages)
    params = answer_params(prompt, messages, output_type, params)
    room = official_max_new_tokens(output_type, len(prompt), params.max_new_tokens)

    def fits(candidate: Prompt) -> bool:
        return len(candidate) + min(room, max_model_len // 2) - 1 <= max_model_len

    left_out = 0
    if truncate_after is not None and not fits(prompt):
        pinned, droppable = list(messages[:truncate_after]), len(messages) - 1 - truncate_after
        # The fewest left out that fit: a prompt only shrinks as more are left out.
        low, high, best = 1, droppable, None
        while low <= high:
            middle = (low + high) // 2
            candidate = build(pinned + list(messages[truncate_after + middle :]))
            if fits(candidate):
                best, high = (middle, candidate), middle - 1
            else:
                low = middle + 1
        if best is None and droppable > 0:  # nothing fits: the least there is
            best = droppable, build(pinned + list(messages[-1:]))
        if best is not None:
            left_out, prompt = best
    return TurnPrompt(prompt, params, left_out)
