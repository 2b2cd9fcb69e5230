"""`bench --http`: what the HTTP layer adds to the time to first audio.

For each count N it starts the server (aiohttp app + pipeline + a scratch store) on
127.0.0.1 and measures, in the same run and on the same pipeline:
- in-process: N concurrent turns submitted to the pipeline directly, submit -> first audio
  chunk (what bench reports as first audio);
- HTTP: N concurrent streaming POST /v1/chat/completions requests (spoken answers, pcm16,
  the same speech and seeds), request sent -> first byte of audio received (the first
  `delta.audio.data` of the server-sent events), over loopback.
Each clip is answered once, untimed, before either side, so both find its encoding and
prompt prefix in the caches. The difference is the HTTP layer's own cost: the body's upload
and JSON/base64 parsing, audio decoding, SSE framing and encoding. Clients share the server's process and event loop, so
with many clients the HTTP figures are an upper bound.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from kimiaudio.audio.io import wav_bytes
from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.bench.stats import ms_p50_p95
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.events import AudioChunk
from kimiaudio.pipeline.turn_request import TurnRequest

MODEL = "kimi-audio-7b-instruct"


async def _pipeline_first_audio(pipeline, config, clip: np.ndarray, seed: int) -> float | None:
    sampling = SamplingParams.from_config(config.sampling, seed=seed)
    start = time.perf_counter()
    handle = pipeline.submit(TurnRequest(f"bench-{seed}", [], clip, sampling, "both"))
    first = None
    async for event in handle:
        if isinstance(event, AudioChunk) and first is None:
            first = time.perf_counter() - start
    return first


async def _http_first_audio(http, url: str, body: dict) -> float | None:
    start = time.perf_counter()
    first = None
    async with http.post(url, json=body) as resp:
        if resp.status != 200:
            raise KimiAudioError(f"bench request failed: {resp.status} {await resp.text()}")
        async for line in resp.content:
            if first is None and line.startswith(b"data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if (choices[0].get("delta", {}).get("audio") or {}).get("data"):
                    first = time.perf_counter() - start
    return first


async def _bench_n(stack, config, n: int, turns: int, clips: list[np.ndarray]) -> dict:
    import aiohttp

    from kimiaudio.bench.loopback_server import loopback_server

    wavs = [base64.b64encode(wav_bytes(c, SPEECH_INPUT_RATE)).decode() for c in clips]
    in_process, over_http = [], []
    async with loopback_server(stack, config) as (base_url, pipeline):
        url = f"{base_url}/v1/chat/completions"
        # Untimed: every clip once, so both sides find its encoding and prompt prefix cached.
        await asyncio.gather(*[_pipeline_first_audio(pipeline, config, clip, 0) for clip in clips])
        for turn in range(turns):
            pick = [(i + turn) % len(clips) for i in range(n)]
            in_process += await asyncio.gather(
                *[_pipeline_first_audio(pipeline, config, clips[k], 1000 + i) for i, k in enumerate(pick)]
            )
            async with aiohttp.ClientSession() as http:
                bodies = [
                    {
                        "model": MODEL,
                        "modalities": ["text", "audio"],
                        "audio": {"voice": "kimi", "format": "pcm16"},
                        "stream": True,
                        "seed": 1000 + i,
                        "messages": [
                            {
                                "role": "user",
                                "content": [{"type": "input_audio", "input_audio": {"data": wavs[k], "format": "wav"}}],
                            }
                        ],
                    }
                    for i, k in enumerate(pick)
                ]
                over_http += await asyncio.gather(*[_http_first_audio(http, url, body) for body in bodies])
    p50, p95 = ms_p50_p95([x for x in in_process if x is not None])
    h50, h95 = ms_p50_p95([x for x in over_http if x is not None])
    return {
        "sessions": n,
        "turns": len(over_http),
        "pipeline_first_audio_ms_p50": p50,
        "pipeline_first_audio_ms_p95": p95,
        "http_first_audio_byte_ms_p50": h50,
        "http_first_audio_byte_ms_p95": h95,
        "http_overhead_ms_p50": None if h50 is None or p50 is None else h50 - p50,
        "turns_without_audio": sum(x is None for x in over_http) + sum(x is None for x in in_process),
    }


def run_http_bench(
    stack, config, sessions: list[int], turns: int, speech: list[np.ndarray] | None, max_new_tokens: int
) -> list[dict]:
    from kimiaudio.bench.webrtc_bench import espeak_speech

    rows = []
    with tempfile.TemporaryDirectory(prefix="kimiaudio-bench-") as tmp:
        config = copy.deepcopy(config)
        config.sampling.max_new_tokens = max_new_tokens  # as the in-process bench's turns
        config.storage.data_dir = tmp  # a scratch database for the answers' ids
        clips = speech or espeak_speech(
            ["Hello, what is the weather like today?", "Tell me a story about a boat."], Path(tmp)
        )
        for n in sessions:
            rows.append(asyncio.run(_bench_n(stack, config, n, turns, clips)))
    return rows


def print_rows(rows: list[dict], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"http": rows}, indent=1))
        return
    print(
        f"{'N':>4} {'turns':>5} {'pipeline 1st audio p50':>22} {'p95':>8} {'HTTP 1st audio byte p50':>23} "
        f"{'p95':>8} {'HTTP cost p50':>13}"
    )
    nan = float("nan")
    for r in rows:
        print(
            f"{r['sessions']:>4} {r['turns']:>5} {r['pipeline_first_audio_ms_p50'] or nan:20.0f}ms "
            f"{r['pipeline_first_audio_ms_p95'] or nan:6.0f}ms {r['http_first_audio_byte_ms_p50'] or nan:21.0f}ms "
            f"{r['http_first_audio_byte_ms_p95'] or nan:6.0f}ms {r['http_overhead_ms_p50'] or nan:11.0f}ms"
        )
    print(
        "pipeline: submit -> first audio chunk, in-process; HTTP: streaming POST /v1/chat/completions (pcm16) "
        "sent -> first audio byte received, on loopback; same speech and seeds"
    )
