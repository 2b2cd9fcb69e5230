"""One engine step's outputs to their turns: text on to the handles, codes and ends collected.

The LM worker runs a step and hands its StepOutputs here. Each output feeds its turn
(LmTurn.add_tokens): a text delta goes to the turn's handle at once; a speech code is collected
for the detokenizer worker (one message per step); a turn that finished, or generated a stop
string, is collected as ended, for the worker to finish once the codes went on (a turn's codes
precede its end). A failure routing one output ends that turn alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import NamedTuple

from kimiaudio.engine.step_output import StepOutput
from kimiaudio.pipeline.lm_turn import LmTurn
from kimiaudio.pipeline.turn_handle import failure_message

log = logging.getLogger(__name__)


class Ended(NamedTuple):
    """A turn the LM is done with, and how its TurnDone will say it ended."""

    turn: LmTurn
    status: str  # "completed" | "failed"
    error: str | None
    reason: str | None  # the finish reason: StreamRules', "stop", "length", ...


@dataclass
class RoutedStep:
    codes: list[tuple[str, int]] = field(default_factory=list)  # (turn id, speech code), in output order
    ended: list[Ended] = field(default_factory=list)


def route_outputs(outputs: list[StepOutput], turns: dict[str, LmTurn], tokenizer) -> RoutedStep:
    """Feed each output to its turn in `turns` (an output of a turn no longer there is dropped);
    a turn's first audio is counted in engine steps, to the step that computed it."""
    routed = RoutedStep()
    for out in outputs:
        turn = turns.get(out.request_id)
        if turn is None:
            continue
        try:
            if "prefill_done_s" not in turn.timings:
                turn.mark("prefill_done_s")
                turn.prompt_len, turn.num_cached = out.num_prompt_tokens, out.num_cached_tokens
            code = turn.add_tokens(out.text_token, out.audio_token, out.text_logprob, out.text_top)
            delta = turn.text_delta(tokenizer, final=out.finished)
            if delta is not None:
                turn.handle.deliver(delta)
            if code is not None and turn.speaks:
                routed.codes.append((turn.turn_id, code))
                if turn.first_audio_steps is None:
                    turn.first_audio_steps = out.step - turn.submit_step
            if out.finished:
                turn.seq_id = None  # the engine is done with it
                status = "failed" if out.error else "completed"
                routed.ended.append(Ended(turn, status, out.error, "stop" if turn.stopped else out.finish_reason))
            elif turn.stopped:  # a stop string: the answer ends here (the worker's finish frees its KV)
                routed.ended.append(Ended(turn, "completed", None, "stop"))
        except Exception as exc:
            log.exception("routing the output of turn %s failed", turn.turn_id)
            routed.ended.append(Ended(turn, "failed", failure_message("generation", exc), None))
    return routed
