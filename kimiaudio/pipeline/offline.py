"""Offline use of the model stack: spoken chat and transcription, batch 1.

This runs the plain reference loop (engine/reference_loop.py) and the offline
detokenizer, exactly the official way; the server uses the batched engine instead. It backs
the `chat` and `transcribe` commands and reports the timings a user compares between machines.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kimiaudio.audio.io import check_speech_input, file_format, load_audio, write_audio
from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.config import Config, check_setting
from kimiaudio.engine.reference_loop import generate_reference
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.engine.stop_rules import official_codes, official_max_new_tokens, official_text_ids
from kimiaudio.errors import AudioInputError, ConfigError, KimiAudioError
from kimiaudio.pipeline.model_stack import DEMO_NOTICE, ModelStack
from kimiaudio.pipeline.turn_prompt import answer_params
from kimiaudio.text.prompt import ASR_INSTRUCTION, Message, build_prompt


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


def _params(config: Config, args) -> SamplingParams:
    """The sampling of the command's flags over [sampling]; built before the model loads, so that
    a flag out of its setting's range is refused at once, by its name."""
    overrides = {}
    for key in ("seed", "max_new_tokens"):
        value = getattr(args, key, None)
        if value is None:
            continue
        try:
            overrides[key] = check_setting("sampling", key, value)
        except ConfigError as exc:
            expected = str(exc).partition(": expected ")[2]  # "<what>, got <value>"
            raise KimiAudioError(f"--{key.replace('_', '-')}: expected {expected}") from None
    if getattr(args, "greedy", False):
        return SamplingParams.greedy(**overrides)
    return SamplingParams.from_config(config.sampling, **overrides)


def _load_inputs(config: Config, files: list[str]) -> list[np.ndarray]:
    """The input files read and checked, before the model loads: a bad file is refused at once."""
    pcms = []
    for file in files:
        pcm = load_audio(file)
        try:
            check_speech_input(pcm, config.audio)
        except AudioInputError as exc:
            raise AudioInputError(f"{file}: {exc}") from None
        pcms.append(pcm)
    return pcms


def _reply_path(out: Path, index: int, count: int) -> Path:
    return out if index == count - 1 else out.with_name(f"{out.stem}.turn{index + 1}{out.suffix or '.wav'}")


def run_chat_command(config, args) -> int:
    out = Path(args.out)
    if not out.parent.is_dir():
        raise KimiAudioError(f"--out {out}: directory {out.parent} does not exist")
    if out.is_dir() or not os.access(out.parent, os.W_OK):  # found now, not after the answers are made
        raise KimiAudioError(f"--out {out}: " + ("a directory" if out.is_dir() else f"{out.parent} is not writable"))
    try:
        file_format(out)  # an unknown suffix, found before the model loads
    except KimiAudioError as exc:
        raise KimiAudioError(f"--out {exc}") from None
    pcms = _load_inputs(config, args.inputs)
    params = _params(config, args)
    start = time.perf_counter()
    stack = ModelStack.load(config, progress=True, text_only=False)  # chat always speaks
    load_s = time.perf_counter() - start
    history: list[Message] = [Message("user", "text", text=t) for t in args.text]
    turns = []
    for index, (file, pcm) in enumerate(zip(args.inputs, pcms)):
        message, encode_timings = user_audio_message(stack, pcm)
        history.append(message)
        turn = answer(stack, history, params, "both")
        turn.timings.update(encode_timings, input_audio_s=len(pcm) / SPEECH_INPUT_RATE)
        path = _reply_path(out, index, len(pcms))
        if turn.audio is None or stack.detokenizer is None:
            raise KimiAudioError("chat: the model stack has no detokenizer, so the answer has no speech")
        write_audio(path, turn.audio, stack.detokenizer.sample_rate)
        history.append(turn.history_message(stack.specials.token_offset))
        turns.append({"input": file, "reply_wav": str(path), **_turn_json(turn)})
    _report(args, stack, {"load_s": load_s, **stack.load_seconds}, turns)
    return 0


def run_transcribe_command(config, args) -> int:
    pcm = _load_inputs(config, [args.input])[0]
    params = _params(config, args)
    start = time.perf_counter()
    stack = ModelStack.load(config, progress=True, text_only=True)
    load_s = time.perf_counter() - start
    message, encode_timings = user_audio_message(stack, pcm)
    messages = [Message("user", "text", text=ASR_INSTRUCTION), message]
    turn = answer(stack, messages, params, "text")
    turn.timings.update(encode_timings, input_audio_s=len(pcm) / SPEECH_INPUT_RATE)
    if args.json:
        _report(args, stack, {"load_s": load_s, **stack.load_seconds}, [{"input": args.input, **_turn_json(turn)}])
    else:
        _demo_notice(stack)
        print(turn.text)
    return 0


def _turn_json(turn: OfflineAnswer) -> dict:
    data = asdict(turn)
    data.pop("audio")
    return data


def _report(args, stack: ModelStack, load_timings: dict, turns: list[dict]) -> None:
    if args.json:
        print(
            json.dumps(
                {
                    "demo_weights": stack.is_demo,
                    "model": str(stack.paths.root),
                    "device": str(stack.device),
                    "dtype": str(stack.dtype).replace("torch.", ""),
                    "load_timings": load_timings,
                    "turns": turns,
                },
                ensure_ascii=False,
                indent=1,
            )
        )
        return
    _demo_notice(stack)
    for turn in turns:
        print(f"{turn['input']} -> {turn.get('reply_wav', '')}: {turn['text']!r}")


def _demo_notice(stack: ModelStack) -> None:
    """The demo weights said on stderr: stdout carries only the answer, for a script to read."""
    if stack.is_demo:
        print(DEMO_NOTICE, file=sys.stderr, flush=True)
