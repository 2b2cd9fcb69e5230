"""The batch-1 reference side of the bench, and the LM alone on both sides.

The reference is the offline path (encode, batch-1 reference loop, offline detokenizer) run
one session after another; the LM-alone comparison runs the same conversations through a
fresh engine (closed loop: each session speaks again as soon as its answer ends) and through
the reference loop, every turn to its length limit.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from kimiaudio.engine.request import EngineRequest, RequestPrompt
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.text.prompt import Message, build_prompt


def bench_reference(stack, inputs: list[list[np.ndarray]], params: list[SamplingParams]) -> tuple[int, float]:
    """Generated tokens and tokens/s of the offline path (encode, batch-1 reference loop, offline
    detokenizer) on the same turns, one session after another."""
    from kimiaudio.pipeline.offline import user_audio_message

    tokens, seconds = reference_run(stack, inputs, params, lambda pcm: user_audio_message(stack, pcm)[0], speak=True)
    return tokens, tokens / seconds


def reference_run(
    stack, sessions: list[list], params: list[SamplingParams], user_message, speak: bool
) -> tuple[int, float]:
    """(generated positions, seconds) of every session's turns through the batch-1 reference
    loop, one session after another; `user_message(x)` makes each user turn's Message."""
    from kimiaudio.pipeline.offline import answer

    tokens, start = 0, time.perf_counter()
    for session, p in zip(sessions, params):
        history: list[Message] = []
        for x in session:
            history.append(user_message(x))
            turn = answer(stack, history, p, "both", speak=speak)
            tokens += turn.num_steps
            history.append(turn.history_message(stack.specials.token_offset))
    return tokens, time.perf_counter() - start


LM_REPEATS = 3  # the LM-alone runs are short: best of three on each side steadies the ratio


def bench_lm(
    stack, config, inputs: list[list[np.ndarray]], params: list[SamplingParams], repeats: int = LM_REPEATS
) -> tuple[int, float, int, float]:
    """Generated positions and positions/s of the LM alone on the same conversations: the
    engine with every session submitting its next turn as soon as its answer ends (a closed
    loop, as users talk), and the batch-1 reference loop, one turn after another; the best of
    `repeats` runs each. Speech is encoded beforehand, outside both timings.

    Every turn runs to the length limit past its stop tokens (`ignore_eos`, as vLLM's
    throughput benchmark), so all N sessions stay in the batch for the whole run: the ratio is
    the engine's at N concurrent sessions. With natural lengths the run ends in a tail where
    the last long replies run almost alone: 16 demo sessions of 2 turns averaged 11 sequences
    per step (1134 positions in 100 steps)."""
    params = [replace(p, ignore_eos=True) for p in params]
    flat = stack.encode_speech_batch([pcm for session in inputs for pcm in session])
    turns = len(inputs[0])
    users = [
        [Message("user", "audio", audio_tokens=c, features=f) for c, f in flat[i * turns : (i + 1) * turns]]
        for i in range(len(inputs))
    ]
    engine_tokens, engine_s = min(
        (lm_engine_run(stack, config, users, params) for _ in range(repeats)), key=lambda run: run[1]
    )
    reference_tokens, reference_s = min(
        (reference_run(stack, users, params, lambda user: user, speak=False) for _ in range(repeats)),
        key=lambda run: run[1],
    )
    return engine_tokens, engine_tokens / engine_s, reference_tokens, reference_tokens / reference_s


def lm_engine_run(stack, config, users: list[list[Message]], params: list[SamplingParams]) -> tuple[int, float]:
    """(generated positions, seconds) of every session's turns through a fresh engine."""
    from kimiaudio.engine.llm_engine import LLMEngine
    from kimiaudio.pipeline.memory_plan import kv_blocks_on_device, plan_stack
    from kimiaudio.pipeline.offline import OfflineAnswer

    offset = stack.specials.token_offset
    # The pool a pipeline of this config gets (memory_plan.py), so both sides hold the same.
    num_blocks = kv_blocks_on_device(plan_stack(stack, config), stack.device)
    engine = LLMEngine(stack.lm, config.engine, stack.device, stack.dtype, num_blocks=num_blocks)
    histories: list[list[Message]] = [[] for _ in users]
    live: dict[str, int] = {}  # request id -> session

    def submit(session: int) -> None:
        turn = len(histories[session]) // 2
        histories[session].append(users[session][turn])
        prompt = build_prompt(histories[session], "both", stack.tokenizer, stack.specials)
        request_id = f"{session}.{turn}"
        engine.add_request(
            EngineRequest(
                request_id,
                RequestPrompt(prompt.audio_ids, prompt.text_ids, prompt.continuous_mask, prompt.features_tensor()),
                params[session],
                "both",
                stack.specials,
            )
        )
        live[request_id] = session

    tokens, start = 0, time.perf_counter()
    for session in range(len(users)):
        submit(session)
    while engine.has_work():
        for out in engine.step():
            tokens += out.text_token is not None
            if not out.finished:
                continue
            session = live.pop(out.request_id)
            if out.finish_reason == "error":
                raise KimiAudioError(f"bench LM turn failed: {out.error}")
            done = out.completion
            if done is None:
                raise KimiAudioError("bench LM turn finished without its completion")
            reply = OfflineAnswer.from_tokens(
                stack, done.text_tokens, done.audio_tokens, out.finish_reason, done.num_steps
            )
            histories[session].append(reply.history_message(offset))
            if len(histories[session]) < 2 * len(users[session]):
                submit(session)
    seconds = time.perf_counter() - start
    engine.release()  # the next run's pool is planned without this one
    return tokens, seconds
