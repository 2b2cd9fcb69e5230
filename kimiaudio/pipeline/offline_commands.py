"""`python -m kimiaudio chat` and `transcribe`: the offline path (offline.py) as commands.

Their flags, input files and the reply's path are checked before the model and torch are
imported (seconds), so a refused command says why at once; the model-side modules are imported
where they are first needed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kimiaudio.audio.io import check_speech_input, file_format, load_audio, write_audio
from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.config import Config, check_setting
from kimiaudio.errors import AudioInputError, ConfigError, KimiAudioError

if TYPE_CHECKING:
    from kimiaudio.engine.sampling_params import SamplingParams
    from kimiaudio.pipeline.model_stack import ModelStack
    from kimiaudio.pipeline.offline import OfflineAnswer


def run_chat_command(config: Config, args) -> int:
    out = _checked_out(Path(args.out))
    pcms = _load_inputs(config, args.inputs)
    flags = _sampling_flags(args)
    from kimiaudio.pipeline.model_stack import ModelStack
    from kimiaudio.pipeline.offline import answer, user_audio_message
    from kimiaudio.text.prompt import Message

    params = _params(config, args, flags)
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


def run_transcribe_command(config: Config, args) -> int:
    pcm = _load_inputs(config, [args.input])[0]
    flags = _sampling_flags(args)
    from kimiaudio.pipeline.model_stack import ModelStack
    from kimiaudio.pipeline.offline import answer, user_audio_message
    from kimiaudio.text.prompt import ASR_INSTRUCTION, Message

    params = _params(config, args, flags)
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


def _checked_out(out: Path) -> Path:
    """--out, refused now (not after the answers are made) if it cannot be written."""
    if not out.parent.is_dir():
        raise KimiAudioError(f"--out {out}: directory {out.parent} does not exist")
    if out.is_dir() or not os.access(out.parent, os.W_OK):
        raise KimiAudioError(f"--out {out}: " + ("a directory" if out.is_dir() else f"{out.parent} is not writable"))
    try:
        file_format(out)  # an unknown suffix
    except KimiAudioError as exc:
        raise KimiAudioError(f"--out {exc}") from None
    return out


def _sampling_flags(args) -> dict:
    """The command's sampling flags, each checked against its [sampling] setting's range and
    refused by its name."""
    flags = {}
    for key in ("seed", "max_new_tokens"):
        value = getattr(args, key, None)
        if value is None:
            continue
        try:
            flags[key] = check_setting("sampling", key, value)
        except ConfigError as exc:
            expected = str(exc).partition(": expected ")[2]  # "<what>, got <value>"
            raise KimiAudioError(f"--{key.replace('_', '-')}: expected {expected}") from None
    return flags


def _params(config: Config, args, flags: dict) -> SamplingParams:
    """The sampling of the command's (checked) flags over [sampling]."""
    from kimiaudio.engine.sampling_params import SamplingParams

    if getattr(args, "greedy", False):
        return SamplingParams.greedy(**flags)
    return SamplingParams.from_config(config.sampling, **flags)


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
    from kimiaudio.pipeline.model_stack import DEMO_NOTICE

    if stack.is_demo:
        print(DEMO_NOTICE, file=sys.stderr, flush=True)
