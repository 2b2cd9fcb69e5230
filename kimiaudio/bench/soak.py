"""`bench --soak`: the real server on loopback under N sessions with faults, then its books.

The server (aiohttp + aiortc + VAD + pipeline + a scratch SQLite store) runs in this process
on 127.0.0.1; N sessions (WebRTC, and every other one over the Realtime WebSocket,
`/v1/realtime`) speak M turns each with random barge-ins, hang-ups mid-answer and
reconnects continuing their conversation, and malformed events (soak_clients.py), for at most
`seconds`. At the end it checks, prints, and fails (exit 1) unless all hold:
- no KV block leaked and no turn left on the pipeline's workers;
- every response created got a response.done (a final status): sent to every client that
  stayed connected, and sent by the server for all of them (kimiaudio_responses_in_progress);
- every user turn a client saw committed is in the store, with its audio;
- `PRAGMA integrity_check` and `foreign_key_check` find nothing;
- every session slot is free again, every malformed event got an error event, no ERROR log;
- every turn of the plan was committed and every planned fault happened (a run cut short by
  `seconds`, or whose clients never got to speak, checked nothing);
- RSS grew by less than `max_rss_growth_mb` over the second half of the run (the first half
  warms up: allocator arenas, caches, every session's first turn); start, quarters and end
  are printed.
The clients run in worker processes past a few sessions (soak_load.py), so their own WebRTC
work does not load the server's event loop.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import os
import random
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kimiaudio.bench.soak_books import SETTLE_S, checked, client_books, missing_commits, print_report, verdict
from kimiaudio.bench.soak_clients import plan_faults
from kimiaudio.bench.soak_load import SessionJob, run_sessions
from kimiaudio.errors import KimiAudioError


def _at_half(samples: list[float], default: float) -> float:
    return samples[len(samples) // 2] if samples else default


async def _sample_rss(samples: list[float], every_s: float = 1.0) -> None:
    while True:
        samples.append(rss_mb())
        await asyncio.sleep(every_s)


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:  # not Linux: the peak is what there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _ErrorCounter(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name}: {record.getMessage()}")


async def _settle(app, pipeline, timeout: float) -> dict:
    from kimiaudio.server.context import SERVER_CONTEXT

    deadline = time.monotonic() + timeout
    while True:
        stats = pipeline.stats()
        idle = stats["turns"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"]
        if (idle and app[SERVER_CONTEXT].sessions.num_reserved == 0) or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.1)


async def _soak(
    stack,
    config,
    sessions: int,
    turns: int,
    seconds: float,
    fault_rate: float,
    clips,
    seed: int,
    max_rss_growth_mb: float,
    client_processes: int,
) -> dict:
    from aiohttp import web

    from kimiaudio.pipeline.pipeline import Pipeline
    from kimiaudio.server.app import create_app
    from kimiaudio.server.context import SERVER_CONTEXT

    pipeline = Pipeline(stack, config)
    await pipeline.start()
    app = create_app(config, stack, pipeline)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))  # loopback only
    port = sock.getsockname()[1]
    await web.SockSite(runner, sock).start()
    errors = _ErrorCounter()
    logging.getLogger().addHandler(errors)
    rng = random.Random(seed)
    plan = plan_faults(sessions, turns, fault_rate, rng)
    started, rss_start = time.monotonic(), rss_mb()
    rss_samples: list[float] = []
    sampler = asyncio.ensure_future(_sample_rss(rss_samples))
    try:
        base_url = f"http://127.0.0.1:{port}"
        kinds = ["webrtc", "websocket"]
        jobs = [SessionJob(i, kinds[i % len(kinds)], plan[i], seed + 1 + i) for i in range(sessions)]
        logs = await run_sessions(base_url, clips, jobs, seconds, client_processes)
        wall_s = time.monotonic() - started
        sampler.cancel()
        stats = await _settle(app, pipeline, SETTLE_S)
        rss_end = rss_mb()
        integrity = await app[SERVER_CONTEXT].store.integrity_problems()
        missing = await missing_commits(app[SERVER_CONTEXT].store, logs)
        reserved = app[SERVER_CONTEXT].sessions.num_reserved
        left_open = app[SERVER_CONTEXT].metrics.registry.get_sample_value("kimiaudio_responses_in_progress")
    finally:
        sampler.cancel()
        await runner.cleanup()  # its shutdown is watched for ERROR lines too
        await pipeline.stop()
        logging.getLogger().removeHandler(errors)
    client_checks, figures, details = client_books(plan, logs, kinds)
    checks = {
        "leaked KV blocks": (stats["kv_blocks_total"] - stats["kv_blocks_free"], 0),
        "turns left on the pipeline": (stats["turns"], 0),
        "responses the server left open": (left_open, 0),
        "committed user turns not stored": (len(missing), 0),
        "integrity_check problems": (len(integrity), 0),
        "session slots still held": (reserved, 0),
        "ERROR log lines": (len(errors.messages), 0),
        **client_checks,
        # Warm-up (allocator arenas, caches, the first sessions) is over by half-time; a leak is not.
        "RSS growth in the second half, MB": (round(rss_end - _at_half(rss_samples, rss_start), 1), max_rss_growth_mb),
    }
    return {
        "sessions": sessions,
        "turns_per_session": turns,
        "transports": kinds,
        "seed": seed,
        "wall_s": round(wall_s, 1),
        "client_processes": client_processes,
        **figures,
        "preemptions": stats["preemptions"],
        "rss_mb_start": round(rss_start, 1),
        "rss_mb_end": round(rss_end, 1),
        "rss_mb_by_quarter": [
            round(rss_samples[min(len(rss_samples) - 1, len(rss_samples) * q // 4)], 1) for q in (1, 2, 3, 4)
        ]
        if rss_samples
        else [],
        **checked(checks),
        "details": {**details, "missing": missing[:10], "integrity": integrity[:10], "errors": errors.messages[:10]},
    }


def run_soak(
    stack,
    config,
    sessions: int,
    turns: int,
    seconds: float,
    fault_rate: float = 0.3,
    speech: list[np.ndarray] | None = None,
    max_new_tokens: int = 64,
    seed: int = 0,
    max_rss_growth_mb: float = 256.0,
    client_processes: int | None = None,
) -> dict:
    """The report (see the module docstring); `client_processes` None: in this process for a
    few sessions, else one worker process per 8 sessions (at most the CPU count)."""
    from kimiaudio.bench.webrtc_bench import espeak_speech

    with tempfile.TemporaryDirectory(prefix="kimiaudio-soak-") as tmp:
        config = copy.deepcopy(config)
        config.storage.data_dir = tmp  # a scratch history database, not the user's
        config.sampling.max_new_tokens = max_new_tokens
        config.server.host = "127.0.0.1"
        config.server.max_sessions = max(config.server.max_sessions, 2 * sessions)  # a reconnect may overlap its close
        clips = speech or espeak_speech(
            [
                "Hello, what is the weather like today?",
                "Tell me a story about a boat.",
                "Please speak a little more slowly.",
            ],
            Path(tmp),
        )
        if client_processes is None:
            client_processes = 0 if sessions <= 4 else min(os.cpu_count() or 1, math.ceil(sessions / 8))
        return asyncio.run(
            _soak(stack, config, sessions, turns, seconds, fault_rate, clips, seed, max_rss_growth_mb, client_processes)
        )


def run_soak_command(config, args) -> int:
    import json

    from kimiaudio.audio.io import load_audio
    from kimiaudio.pipeline.model_stack import ModelStack, freeze_loaded_objects

    try:
        sessions, turns = int(args.sessions), int(args.turns)
    except ValueError:
        raise KimiAudioError(f"--soak takes one session count, got --sessions {args.sessions!r}") from None
    if sessions < 1 or turns < 1 or not args.seconds > 0 or not 0 <= args.fault_rate <= 1:
        raise KimiAudioError("--sessions, --turns and --seconds must be positive, --fault-rate in [0, 1]")
    speech = [load_audio(path) for path in args.speech] or None
    if args.url:  # a running server or a fleet's front: no model here
        from kimiaudio.bench.soak_remote import run_remote_soak

        report = run_remote_soak(
            args.url,
            sessions,
            turns,
            args.seconds,
            args.fault_rate,
            speech,
            client_processes=args.client_processes,
            api_key=os.environ.get("KIMIAUDIO_API_KEY"),
        )
    else:
        stack = ModelStack.load(config, progress=not args.json)
        if stack.detokenizer is None:
            raise KimiAudioError("bench --soak needs the detokenizer: set model.text_only = false")
        freeze_loaded_objects()
        report = run_soak(
            stack,
            config,
            sessions,
            turns,
            args.seconds,
            args.fault_rate,
            speech,
            args.max_new_tokens,
            client_processes=args.client_processes,
        )
    if args.json:
        print(json.dumps(report, indent=1))
        if not report["ok"]:
            print(verdict(report), file=sys.stderr)
    else:
        print_report(report)
    return 0 if report["ok"] else 1
