"""`python -m kimiaudio bench --transcribe`: what transcribing the user's words costs the answers.

The server transcribes each committed user turn as a background-priority ASR request beside
the answer (pipeline/transcription.py). For each session count N, the same sessions (same
inputs, seeds, load) run twice through the pipeline in this process: answers alone, then each
answer submitted together with the transcription of its user turn, as a session does. The
table compares the answers' first audio in engine steps (from the LM worker taking the turn
to its first speech code: each step serves the answers' work before the transcriptions', so
one session's answer takes no extra step; with several sessions, which requests a step sees
depends on thread timing, and the paired count moves by a few steps either way) and in
milliseconds (submit -> first PCM; on a CPU each step of the bigger batch is slower), and
counts the transcriptions completed.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass

import numpy as np

from kimiaudio.bench.pipeline_bench import bench_inputs, warm_up
from kimiaudio.bench.stats import percentile
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.pipeline.transcription import transcription_request
from kimiaudio.pipeline.turn_request import HistoryTurn, TurnRequest


@dataclass
class TranscriptionRow:
    sessions: int
    turns: int
    first_audio_steps_p50: float | None  # answers alone
    first_audio_steps_max: int
    with_asr_first_audio_steps_p50: float | None  # each answer beside its user turn's transcription
    with_asr_first_audio_steps_max: int
    max_extra_steps: int  # the largest (with - without) of one answer, paired by session and turn
    first_audio_ms_p50: float | None
    with_asr_first_audio_ms_p50: float | None
    transcripts_completed: int
    transcripts_nonempty: int


async def _session(pipeline: Pipeline, inputs: list[np.ndarray], params: SamplingParams, asr: SamplingParams | None):
    history: list[HistoryTurn] = []
    answers, transcriptions = [], []
    for pcm in inputs:
        handle = pipeline.submit(TurnRequest("bench", list(history), pcm, params))
        if asr is not None:  # right after the answer, as a session submits it
            transcriptions.append(
                asyncio.ensure_future(pipeline.submit(transcription_request("bench", pcm, asr)).result())
            )
        done = await handle.result()
        if done is None or done.status != "completed" or done.first_audio_steps is None:
            raise KimiAudioError(f"bench turn failed: {done.error or done.status if done else 'no result'}")
        answers.append(done)
        history += [
            HistoryTurn("user", audio=pcm),
            HistoryTurn("assistant", text=done.text, audio_tokens=done.audio_tokens),
        ]
    return answers, [await t for t in transcriptions]


async def _run(stack, config, inputs, params, transcribe: bool):
    pipeline = Pipeline(stack, config)
    await pipeline.start()
    asr = SamplingParams.from_config(config.sampling) if transcribe else None
    try:
        return await asyncio.gather(*[_session(pipeline, inputs[i], params[i], asr) for i in range(len(inputs))])
    finally:
        await pipeline.stop()


def run_transcription_bench(
    stack,
    config,
    sessions: list[int],
    turns: int,
    max_new_tokens: int,
    speech: list[np.ndarray] | None,
    fixed_length: bool = True,
) -> list[TranscriptionRow]:
    warm_up(stack, config, reference=False)
    rows = []
    for n in sessions:
        inputs, params = bench_inputs(config, n, turns, max_new_tokens, speech, fixed_length)
        alone = asyncio.run(_run(stack, config, inputs, params, transcribe=False))
        mixed = asyncio.run(_run(stack, config, inputs, params, transcribe=True))
        steps = [d.first_audio_steps for answers, _ in alone for d in answers]
        steps_asr = [d.first_audio_steps for answers, _ in mixed for d in answers]
        ms = [1000 * d.timings["first_pcm_s"] for answers, _ in alone for d in answers if "first_pcm_s" in d.timings]
        ms_asr = [
            1000 * d.timings["first_pcm_s"] for answers, _ in mixed for d in answers if "first_pcm_s" in d.timings
        ]
        asr_done = [t for _, ts in mixed for t in ts]
        rows.append(
            TranscriptionRow(
                sessions=n,
                turns=turns,
                first_audio_steps_p50=percentile(steps, 50),
                first_audio_steps_max=max(steps),
                with_asr_first_audio_steps_p50=percentile(steps_asr, 50),
                with_asr_first_audio_steps_max=max(steps_asr),
                max_extra_steps=max(b - a for a, b in zip(steps, steps_asr)),
                first_audio_ms_p50=percentile(ms, 50),
                with_asr_first_audio_ms_p50=percentile(ms_asr, 50),
                transcripts_completed=sum(t.status == "completed" for t in asr_done),
                transcripts_nonempty=sum(bool(t.text.strip()) for t in asr_done),
            )
        )
    return rows


def print_transcription_rows(rows: list[TranscriptionRow], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"rows": [asdict(r) for r in rows]}, indent=1))
        return
    print(
        "answers' first audio without and with the transcription of each user turn beside them "
        "(same sessions and seeds); steps: engine steps from the LM worker taking the turn to its first speech code"
    )
    print(
        f"{'N':>4} {'turns':>5} {'steps p50':>9} {'max':>5} {'+ASR p50':>9} {'max':>5} {'extra max':>9} "
        f"{'1st audio p50':>13} {'+ASR p50':>9} {'ASR done':>9}"
    )
    for r in rows:
        print(
            f"{r.sessions:>4} {r.turns:>5} {r.first_audio_steps_p50:9.1f} {r.first_audio_steps_max:>5} "
            f"{r.with_asr_first_audio_steps_p50:9.1f} {r.with_asr_first_audio_steps_max:>5} {r.max_extra_steps:>9} "
            f"{r.first_audio_ms_p50:11.0f}ms {r.with_asr_first_audio_ms_p50:7.0f}ms "
            f"{r.transcripts_completed:>4}/{r.sessions * r.turns:<4}"
        )
