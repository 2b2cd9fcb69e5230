"""Offline use of the model stack: spoken chat and transcription, batch 1.

This runs the plain reference loop (engine/reference_loop.py) and the offline
detokenizer, exactly the official way; the server uses the batched engine instead. It backs
the `chat` and `transcribe` commands (offline_commands.py), with the timings a user compares
between machines.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np

from kimiaudio.engine.reference_loop import generate_reference
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.engine.stop_rules import official_codes, official_max_new_tokens, official_text_ids
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.model_stack import ModelStack
from kimiaudio.pipeline.turn_prompt import answer_params
from kimiaudio.text.prompt import Message, build_prompt


@dataclass
class OfflineAnswer:
    """One answer of the offline path (the batch-1 reference loop), as the official code returns it."""

    text: str
    text_tokens: list[int]  # raw ids as the official loop returns them
    audio_tokens: list[int]  # raw ids (with the token offset)
    finish_reason: str | None
    num_steps: int = 0  # generated positions
    audio: np.ndarray | None = None  # 24 kHz reply, None for text output
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_tokens(
        cls,
        stack: ModelStack,
        text_tokens: list[int],
        audio_tokens: list[int],
        finish_reason: str | None,
        num_steps: int,
    ) -> OfflineAnswer:
        """One generation's official return values, its text decoded as official generate() does."""
        text = stack.tokenizer.decode(official_text_ids(text_tokens, stack.specials.token_offset))
        return cls(text, text_tokens, audio_tokens, finish_reason, num_steps)

    def codes(self, token_offset: int) -> list[int]:
        """The reply's speech codes (no offset), as history and the detokenizer take them."""
        return official_codes(self.audio_tokens, token_offset)

    def history_message(self, token_offset: int) -> Message:
        return Message.assistant_reply(self.text, self.codes(token_offset))


def user_audio_message(stack: ModelStack, pcm: np.ndarray) -> tuple[Message, dict[str, float]]:
    start = time.perf_counter()
    codes, features = stack.encode_speech(pcm)
    seconds = time.perf_counter() - start
    return Message("user", "audio", audio_tokens=codes, features=features), {"encode_s": seconds}


def answer(
    stack: ModelStack, messages: list[Message], params: SamplingParams, output_type: str, speak: bool = True
) -> OfflineAnswer:
    """Generate the assistant's answer to `messages` (and speak it when output_type is both
    and `speak`; speak=False leaves the codes undecoded, e.g. to time the LM alone)."""
    prompt = build_prompt(messages, output_type, stack.tokenizer, stack.specials)
    # A conversation's answer gets the room of its own exchange, as the server's does.
    params = _within_positions(stack, len(prompt), answer_params(prompt, messages, output_type, params), output_type)
    start = time.perf_counter()
    result = generate_reference(
        stack.lm,
        prompt.audio_ids,
        prompt.text_ids,
        prompt.continuous_mask,
        prompt.features_tensor(),
        params,
        output_type,
        stack.specials,
        device=stack.device,
    )
    gen_s = time.perf_counter() - start
    offset = stack.specials.token_offset
    timings = {
        "prompt_tokens": float(len(prompt)),
        "generate_s": gen_s,
        "steps_per_s": result.num_steps / max(gen_s, 1e-9),
    }
    turn = OfflineAnswer.from_tokens(
        stack, result.text_tokens, result.audio_tokens, result.finish_reason, result.num_steps
    )
    turn.timings = timings
    codes = turn.codes(offset)
    if speak and output_type == "both" and stack.detokenizer is not None:
        start = time.perf_counter()
        turn.audio = stack.detokenizer.detokenize(codes).numpy()  # float32 on the CPU; empty for no codes
        detok_s = time.perf_counter() - start
        seconds = len(turn.audio) / stack.detokenizer.sample_rate
        timings.update(detok_s=detok_s, audio_s=seconds, detok_rtf=detok_s / seconds if seconds else 0.0)
    return turn


def _within_positions(stack: ModelStack, prompt_len: int, params: SamplingParams, output_type: str) -> SamplingParams:
    """`params`, its answer kept within the model's positions (config.json max_position_embeddings,
    the official cache length); KimiAudioError when no room is left for an answer (the official
    loop would silently answer nothing, or index past its position table)."""
    positions = stack.lm.config.max_position_embeddings
    room = official_max_new_tokens(output_type, prompt_len, params.max_new_tokens)
    if room < 1 or prompt_len >= positions:
        kind = "spoken" if output_type == "both" else "text"
        raise KimiAudioError(
            f"the prompt is {prompt_len} positions, which leaves no room for a {kind} answer (the official "
            f"limit is {official_max_new_tokens(output_type, 0)} positions, prompt included; the model's "
            f"max_position_embeddings is {positions}): give shorter audio"
        )
    if prompt_len + room > positions:
        return dataclasses.replace(params, max_new_tokens=positions - prompt_len)
    return params
