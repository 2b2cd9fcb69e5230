"""`python -m kimiaudio bench --voice [FILE]`: what speaking in a voice costs.

A voice's prefix makes every DiT call of a chunk attend to the reference's frames too (up to
the K/V cap), so chunks cost more and the first audio comes later. For each session count N,
the same sessions (same inputs, seeds, load) run twice through the pipeline: in the model's own
voice and in a voice made from FILE (a 6 s synthetic voiced signal when none is given); the
table gives first-audio latency (commit -> first PCM) and the detokenizer batch time of both.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict

import numpy as np

from kimiaudio.audio.io import load_audio
from kimiaudio.audio.rates import SPEECH_INPUT_RATE, SPEECH_OUTPUT_RATE
from kimiaudio.bench.pipeline_bench import BenchRow, bench_inputs, bench_pipeline, warm_up
from kimiaudio.bench.speech import synthetic_speech

DEFAULT_VOICE_SECONDS = 6.0


def voice_audio(path: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(16 kHz, 24 kHz) of the reference: the file, or the synthetic voice."""
    if path:
        return load_audio(path, SPEECH_INPUT_RATE), load_audio(path, SPEECH_OUTPUT_RATE)
    return (
        synthetic_speech(DEFAULT_VOICE_SECONDS, seed=7, sr=SPEECH_INPUT_RATE),
        synthetic_speech(DEFAULT_VOICE_SECONDS, seed=7, sr=SPEECH_OUTPUT_RATE),
    )


def run_voice_bench(
    stack,
    config,
    sessions: list[int],
    turns: int,
    max_new_tokens: int,
    speech: list[np.ndarray] | None,
    voice_path: str | None,
    fixed_length: bool = True,
) -> list[tuple[BenchRow, BenchRow]]:
    """Per N: (the row without a voice, the row with it)."""
    reference = voice_audio(voice_path)
    warm_up(stack, config, reference=False)
    rows = []
    for n in sessions:
        inputs, params = bench_inputs(config, n, turns, max_new_tokens, speech, fixed_length)
        plain = asyncio.run(bench_pipeline(stack, config, n, inputs, params))
        voiced = asyncio.run(bench_pipeline(stack, config, n, inputs, params, voice_audio=reference))
        rows.append((plain, voiced))
    return rows


def print_voice_rows(rows: list[tuple[BenchRow, BenchRow]], voice_seconds: float, as_json: bool) -> None:
    if as_json:
        print(
            json.dumps(
                {
                    "voice_seconds": voice_seconds,
                    "rows": [{"sessions": a.sessions, "no_voice": asdict(a), "voice": asdict(b)} for a, b in rows],
                },
                indent=1,
            )
        )
        return
    print(f"first audio (commit -> first PCM) without and with a {voice_seconds:.1f} s voice, same sessions and seeds")
    print(
        f"{'N':>4} {'1st audio p50':>13} {'p95':>8} {'voice p50':>10} {'p95':>8} {'+p50':>8} "
        f"{'detok p50':>10} {'voice':>8} {'RTF p50':>8} {'voice':>6} {'underruns':>9} {'voice':>6}"
    )
    for a, b in rows:
        print(
            f"{a.sessions:>4} {a.first_audio_ms_p50:11.0f}ms {a.first_audio_ms_p95:6.0f}ms "
            f"{b.first_audio_ms_p50:8.0f}ms {b.first_audio_ms_p95:6.0f}ms "
            f"{b.first_audio_ms_p50 - a.first_audio_ms_p50:+6.0f}ms {a.detok_ms_p50:8.1f}ms {b.detok_ms_p50:6.1f}ms "
            f"{a.rtf_p50:8.2f} {b.rtf_p50:6.2f} {a.underruns:>9} {b.underruns:>6}"
        )
