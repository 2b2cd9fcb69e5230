"""`bench --webrtc`: latency as a user feels it, through the real server on loopback.

For each client count N it starts the server (aiohttp + aiortc + VAD + pipeline + a scratch
SQLite store) on 127.0.0.1, connects N real WebRTC clients that each speak several turns, and
reports the server's commit -> first audio frame sent (from each response.done) p50/p95,
and how many sequences the engine ran in one step at most. The clients share the server's
process and event loop (their RTP and pacing work competes with the server's), so with many
clients the figures are an upper bound of what separate users would see.
"""

from __future__ import annotations

import asyncio
import copy
import json
import tempfile
from pathlib import Path

import numpy as np

from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.bench.speech import espeak_speech
from kimiaudio.bench.stats import ms_p50_p95
from kimiaudio.errors import KimiAudioError

SILENCE_S = 1.2  # after each utterance: longer than the VAD's end-of-speech silence


async def _client_turns(base_url: str, clips: list[np.ndarray], turns: int, offset: int) -> list[float]:
    import aiohttp

    from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic

    latencies = []
    async with aiohttp.ClientSession(base_url=base_url) as http:
        mic = ScriptedMic()
        client = RtcClient(mic)
        status, answer = await client.connect(http)
        if status != 201:
            raise KimiAudioError(f"bench client could not connect: {answer}")
        try:
            for turn in range(turns):
                clip = clips[(offset + turn) % len(clips)]
                mic.say(np.concatenate([clip, np.zeros(int(SILENCE_S * SPEECH_INPUT_RATE), np.float32)]))
                done = await client.wait_for("response.done", count=turn + 1, timeout=120)
                timing = done["response"].get("timings", {}).get("commit_to_first_audio_s")
                if timing is not None:
                    latencies.append(timing)
        finally:
            await client.close()
    return latencies


async def _bench_clients(stack, config, n: int, turns: int, clips: list[np.ndarray]) -> dict:
    from kimiaudio.bench.loopback_server import loopback_server

    async with loopback_server(stack, config) as (base_url, pipeline):
        results = await asyncio.gather(*[_client_turns(base_url, clips, turns, i) for i in range(n)])
    latencies = [x for r in results for x in r]
    return {
        "clients": n,
        "turns": len(latencies),
        **dict(zip(("commit_to_first_audio_ms_p50", "commit_to_first_audio_ms_p95"), ms_p50_p95(latencies))),
        "max_llm_batch": pipeline.metrics.max_batch["llm"],
        "max_detok_batch": pipeline.metrics.max_batch["detok"],
    }


def run_webrtc_bench(
    stack, config, clients: list[int], turns: int, speech: list[np.ndarray] | None, max_new_tokens: int
) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="kimiaudio-bench-") as tmp:
        config = copy.deepcopy(config)
        config.sampling.max_new_tokens = max_new_tokens  # as the in-process bench's turns
        config.storage.data_dir = tmp  # a scratch history database, not the user's
        config.server.max_sessions = max(config.server.max_sessions, max(clients))
        clips = speech or espeak_speech(
            [
                "Hello, what is the weather like today?",
                "Tell me a story about a small boat.",
                "Please speak a little more slowly.",
                "What time does the museum open?",
            ],
            Path(tmp),
        )
        for n in clients:
            rows.append(asyncio.run(_bench_clients(stack, config, n, turns, clips)))
    return rows


def print_rows(rows: list[dict], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"webrtc": rows}, indent=1))
        return
    print(f"{'clients':>7} {'turns':>5} {'commit->first audio p50':>24} {'p95':>8} {'max LLM batch':>13}")
    for r in rows:
        p50, p95 = r["commit_to_first_audio_ms_p50"], r["commit_to_first_audio_ms_p95"]
        print(
            f"{r['clients']:>7} {r['turns']:>5} {p50 or float('nan'):22.0f}ms {p95 or float('nan'):6.0f}ms "
            f"{r['max_llm_batch']:>13}"
        )
