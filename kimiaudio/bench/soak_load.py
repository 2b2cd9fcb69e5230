"""The soak's load: its sessions' clients, in this process or spread over worker processes.

In one process the clients share the server's event loop, and past a few WebRTC sessions
their own Opus and SRTP work is a good part of what the loop does; in worker processes
(`client_processes`, spawned) they leave the server its loop, so the soak measures the server.
Each worker runs its share of the sessions and sends their SessionLogs back.
"""

from __future__ import annotations

import asyncio
import random
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

import numpy as np

from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.bench.soak_clients import SILENCE_S, SessionLog, Transport, run_session


@dataclass(frozen=True)
class SessionJob:
    index: int
    transport: str  # webrtc | websocket
    faults: list[str]  # one per turn
    seed: int


def _transports(http) -> dict[str, Transport]:
    from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
    from kimiaudio.bench.realtime_ws_client import RealtimeWsClient

    silence = np.zeros(int(SILENCE_S * SPEECH_INPUT_RATE), np.float32)

    async def rtc_connect(conversation_id):
        client = RtcClient(ScriptedMic())
        body = {"conversation_id": conversation_id} if conversation_id else {}
        status, _ = await client.connect(http, **body)
        try:
            if status == 200:
                await client.wait_for("session.created", timeout=30)  # the data channel is open
                return client
        except AssertionError:
            pass
        await client.close()
        return None

    async def rtc_raw(client, text):
        client.channel.send(text)

    async def ws_connect(conversation_id):
        client = RealtimeWsClient()
        if await client.connect(http) != 101:
            return None
        try:
            await client.wait_for("session.created", timeout=30)
            if conversation_id is not None:  # a reconnect continues its conversation, as WebRTC's offer does
                await client.send({"type": "conversation.select", "conversation_id": conversation_id})
                await client.wait_for("session.updated", timeout=30)
            return client
        except AssertionError:
            await client.close()
            return None

    async def ws_raw(client, text):
        await client.send(text)

    def rtc_connected(client) -> bool:
        return client.pc.connectionState not in ("failed", "closed") and client.channel.readyState == "open"

    return {
        "webrtc": Transport("webrtc", rtc_connect, lambda c, pcm: c.mic.say(np.concatenate([pcm, silence])), rtc_raw,
                            rtc_connected),
        "websocket": Transport("websocket", ws_connect, lambda c, pcm: c.say(pcm, SILENCE_S), ws_raw,
                               lambda c: not c.closed),
    }


async def _run_here(base_url: str, clips: list[np.ndarray], jobs: list[SessionJob], seconds: float) -> list[SessionLog]:
    import aiohttp

    deadline = time.monotonic() + seconds
    logs = [SessionLog(job.transport) for job in jobs]
    async with aiohttp.ClientSession(base_url=base_url) as http:
        transports = _transports(http)
        await asyncio.gather(*(run_session(transports[job.transport], clips, job.faults, deadline, log,
                                           random.Random(job.seed)) for job, log in zip(jobs, logs)))
    return logs


def _run_in_worker(base_url: str, clips: list[np.ndarray], jobs: list[SessionJob], seconds: float) -> list[SessionLog]:
    return asyncio.run(_run_here(base_url, clips, jobs, seconds))


async def run_sessions(base_url: str, clips: list[np.ndarray], jobs: list[SessionJob], seconds: float,
                       processes: int) -> list[SessionLog]:
    """Every job's SessionLog, in job order; `processes` 0: the clients run on this loop."""
    if processes <= 0:
        return await _run_here(base_url, clips, jobs, seconds)
    shares = [jobs[i::processes] for i in range(processes) if jobs[i::processes]]
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(len(shares), mp_context=get_context("spawn")) as pool:
        results = await asyncio.gather(*(loop.run_in_executor(pool, _run_in_worker, base_url, clips, share, seconds)
                                         for share in shares))
    by_index = {job.index: log for share, logs in zip(shares, results) for job, log in zip(share, logs)}
    return [by_index[job.index] for job in jobs]
