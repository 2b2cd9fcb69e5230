"""One synthetic conversation through the pipeline, measured as its listener hears it.

A session speaks its turns one after another, each with the history so far (the user's audio,
the answer's text and codes), after its arrival delay (bench/arrivals.py). Per turn it counts
the generated tokens, submit -> first PCM chunk, the real-time factor, each stage's time
(STAGES, from the TurnDone's timings) and the silence a listener playing from the first chunk
hears (PlaybackClock). A turn that does not complete ends the bench with its error.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.events import AudioChunk, TurnDone
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.pipeline.turn_request import HistoryTurn, TurnRequest

# TurnDone.timings pairs (begin, end) of each stage reported per row.
STAGES = {
    "queue": (None, "queued_s"),
    "encode": ("queued_s", "encoded_s"),
    "prefill": ("encoded_s", "prefill_done_s"),
    "first_audio_token": ("prefill_done_s", "first_audio_token_s"),
    "first_pcm": ("first_audio_token_s", "first_pcm_s"),
}


class PlaybackClock:
    """A listener who starts playing at the first chunk and plays without pausing: the
    seconds of silence it hears because a chunk came after the audio before it ran out."""

    def __init__(self, sample_rate: int):
        self.sample_rate = sample_rate
        self.played_until: float | None = None
        self.stall_s = 0.0
        self.underruns = 0
        self.samples = 0

    def arrive(self, now: float, num_samples: int) -> None:
        if self.played_until is None:
            self.played_until = now
        elif now > self.played_until:
            self.stall_s += now - self.played_until
            self.underruns += 1
            self.played_until = now
        self.played_until += num_samples / self.sample_rate
        self.samples += num_samples


async def run_session(
    pipeline: Pipeline, inputs: list[np.ndarray], params: SamplingParams, sr_out: int, voice=None, delay_s: float = 0.0
) -> dict:
    history: list[HistoryTurn] = []
    stats: dict[str, Any] = {
        "tokens": 0,
        "first_audio": [],
        "rtf": [],
        "stall": [],
        "underruns": 0,
        "stages": {stage: [] for stage in STAGES},
    }
    if delay_s > 0:
        await asyncio.sleep(delay_s)  # its arrival (bench/arrivals.py)
    for pcm in inputs:
        handle = pipeline.submit(TurnRequest("bench", list(history), pcm, params, voice=voice))
        clock, done = PlaybackClock(sr_out), None
        async for event in handle:
            if isinstance(event, AudioChunk):
                clock.arrive(time.perf_counter(), event.pcm.size)
            elif isinstance(event, TurnDone):
                done = event
        samples = clock.samples
        stats["stall"].append(clock.stall_s)
        stats["underruns"] += clock.underruns
        if done is None or done.status != "completed":
            raise KimiAudioError(f"bench turn failed: {done.error if done else 'no result'}")
        stats["tokens"] += len(done.text_tokens)  # one text token per generated position
        if "first_pcm_s" in done.timings:
            stats["first_audio"].append(done.timings["first_pcm_s"])
        for stage, (begin, end) in STAGES.items():
            if end in done.timings and (begin is None or begin in done.timings):
                stats["stages"][stage].append(done.timings[end] - (done.timings[begin] if begin else 0.0))
        if samples:
            busy = done.timings["done_s"] - done.timings.get("encoded_s", 0.0)
            stats["rtf"].append(busy / (samples / sr_out))
        history += [
            HistoryTurn("user", audio=pcm),
            HistoryTurn("assistant", text=done.text, audio_tokens=done.audio_tokens),
        ]
    return stats
