"""`bench --soak --url FRONT`: the soak's sessions against a server already running, e.g. a
fleet's front (HAProxy before several instances; docs/deploy.md), instead of one in-process.

The same plan as the in-process soak (soak.py): N sessions, WebRTC and the Realtime WebSocket,
barge-ins, hang-ups mid-answer and reconnects (which, behind a router, may land on another
instance and wait out a `409 conversation_busy`, as soak_load.py's clients do), malformed
events. It checks what a client can see: every response got a final status, every committed
user turn is stored with its audio (read back through the front's `/api/conversations`), the
planned turns and faults happened, no client-side problem, and the front is ready again
(`/readyz` 200) once the sessions are over. The books only a server can keep (KV blocks, slots,
RSS, its log) are each instance's, on its `/metrics` and in its log. No model is loaded here.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from kimiaudio.bench.soak_books import SETTLE_S, checked, client_books, missing_commits
from kimiaudio.bench.soak_clients import plan_faults
from kimiaudio.bench.soak_load import SessionJob, run_sessions
from kimiaudio.errors import KimiAudioError


class _StoredOverHttp:
    """The stored conversations as `missing_commits` reads them, through the front's API."""

    def __init__(self, http):
        self._http = http

    async def get_conversation(self, conversation_id: str) -> dict | None:
        resp = await self._http.get(f"/api/conversations/{conversation_id}")
        return await resp.json() if resp.status == 200 else None


async def _why(resp) -> str:
    """What a refused /healthz says: its error's message (a front with no instance ready, a host
    not allowed), and where the API key goes when that is what is missing."""
    try:
        message = str((await resp.json(content_type=None))["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = (await resp.text())[:200].strip() or resp.reason or "no reason given"
    if resp.status == 401:
        message += " (an API key goes in KIMIAUDIO_API_KEY)"
    return message


async def _ready_again(http, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if (await http.get("/readyz")).status == 200:
                return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.5)


async def _soak_remote(
    url: str,
    sessions: int,
    turns: int,
    seconds: float,
    fault_rate: float,
    clips,
    seed: int,
    client_processes: int,
    headers: dict[str, str],
) -> dict:
    import aiohttp

    async with aiohttp.ClientSession(base_url=url, headers=headers) as http:
        try:
            reachable = await http.get("/healthz")
        except aiohttp.ClientError as exc:
            raise KimiAudioError(f"--url {url}: cannot connect ({exc})") from None
        if reachable.status != 200:
            raise KimiAudioError(f"--url {url}: /healthz answered {reachable.status}: {await _why(reachable)}")
        plan = plan_faults(sessions, turns, fault_rate, random.Random(seed))
        kinds = ["webrtc", "websocket"]
        jobs = [SessionJob(i, kinds[i % len(kinds)], plan[i], seed + 1 + i) for i in range(sessions)]
        started = time.monotonic()
        logs = await run_sessions(url, clips, jobs, seconds, client_processes, headers)
        wall_s = time.monotonic() - started
        ready = await _ready_again(http, SETTLE_S)
        missing = await missing_commits(_StoredOverHttp(http), logs)
    client_checks, figures, details = client_books(plan, logs, kinds)
    checks = {
        "committed user turns not stored": (len(missing), 0),
        **client_checks,
        "front not ready after the run": (0 if ready else 1, 0),
    }
    return {
        "url": url,
        "sessions": sessions,
        "turns_per_session": turns,
        "transports": kinds,
        "seed": seed,
        "wall_s": round(wall_s, 1),
        "client_processes": client_processes,
        **figures,
        **checked(checks),
        "details": {**details, "missing": missing[:10]},
    }


def run_remote_soak(
    url: str,
    sessions: int,
    turns: int,
    seconds: float,
    fault_rate: float = 0.3,
    speech: list[np.ndarray] | None = None,
    seed: int = 0,
    client_processes: int | None = None,
    api_key: str | None = None,
) -> dict:
    """The report (see the module docstring and soak.py's); `api_key` is sent as a Bearer token."""
    from kimiaudio.bench.webrtc_bench import espeak_speech

    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise KimiAudioError(f"--url {url!r}: expected http://host:port or https://host")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with tempfile.TemporaryDirectory(prefix="kimiaudio-soak-") as tmp:
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
            _soak_remote(url, sessions, turns, seconds, fault_rate, clips, seed, client_processes, headers)
        )
