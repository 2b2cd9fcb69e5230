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

BUSY_RETRIES = 10  # attempts to reopen a conversation answered conversation_busy
BUSY_WAIT_MAX_S = 5.0


@dataclass(frozen=True)
class SessionJob:
    index: int
    transport: str  # webrtc | websocket
    faults: list[str]  # one per turn
    seed: int


async def _select(client, conversation_id: str, timeout: float = 30.0) -> bool:
    """conversation.select on a Realtime WebSocket: True once selected, False if it is held by
    another session (conversation_busy: the hung-up one still closing, behind a router perhaps
    on another instance); AssertionError if neither comes."""
    seen = len(client.events)
    await client.send({"type": "conversation.select", "conversation_id": conversation_id})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in client.events[seen:]:
            if event.get("type") == "session.updated":
                return True
            if event.get("type") == "error" and event["error"].get("code") == "conversation_busy":
                return False
        await asyncio.sleep(0.05)
    raise AssertionError(f"conversation.select of {conversation_id} got no answer in {timeout} s")


def _transports(http) -> dict[str, Transport]:
    from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
    from kimiaudio.bench.realtime_ws_client import RealtimeWsClient

    silence = np.zeros(int(SILENCE_S * SPEECH_INPUT_RATE), np.float32)

    async def rtc_connect(conversation_id, log):
        for _ in range(BUSY_RETRIES):
            client = RtcClient(ScriptedMic())
            status, _ = await client.connect(http, conversation_id=conversation_id)
            try:
                if status == 201:
                    await client.wait_for("session.created", timeout=30)  # the data channel is open
                    return client
            except AssertionError:
                pass
            await client.close()
            if status != 409:
                return None
            # conversation_busy: the session it hung up is still closing (behind a router,
            # possibly on another instance); a client waits as Retry-After says.
            log.busy_waits += 1
            await asyncio.sleep(min(float(client.response_headers.get("Retry-After", 1)), BUSY_WAIT_MAX_S))
        return None

    async def rtc_raw(client, text):
        client.channel.send(text)

    async def ws_connect(conversation_id, log):
        client = RealtimeWsClient()
        if await client.connect(http) != 101:
            return None
        try:
            await client.wait_for("session.created", timeout=30)
            if conversation_id is None:
                return client
            for _ in range(BUSY_RETRIES):  # a reconnect continues its conversation, as WebRTC's offer does
                if await _select(client, conversation_id):
                    return client
                log.busy_waits += 1
                await asyncio.sleep(1.0)
        except AssertionError:
            pass
        await client.close()
        return None

    async def ws_raw(client, text):
        await client.send(text)

    def rtc_connected(client) -> bool:
        return client.pc.connectionState not in ("failed", "closed") and client.channel.readyState == "open"

    return {
        "webrtc": Transport(
            "webrtc", rtc_connect, lambda c, pcm: c.mic.say(np.concatenate([pcm, silence])), rtc_raw, rtc_connected
        ),
        "websocket": Transport(
            "websocket", ws_connect, lambda c, pcm: c.say(pcm, SILENCE_S), ws_raw, lambda c: not c.closed
        ),
    }


async def _run_here(
    base_url: str,
    clips: list[np.ndarray],
    jobs: list[SessionJob],
    seconds: float,
    headers: dict[str, str] | None = None,
) -> list[SessionLog]:
    import aiohttp

    deadline = time.monotonic() + seconds
    logs = [SessionLog(job.transport) for job in jobs]
    async with aiohttp.ClientSession(base_url=base_url, headers=headers) as http:
        transports = _transports(http)
        await asyncio.gather(
            *(
                run_session(transports[job.transport], clips, job.faults, deadline, log, random.Random(job.seed))
                for job, log in zip(jobs, logs)
            )
        )
    return logs


def _run_in_worker(
    base_url: str, clips: list[np.ndarray], jobs: list[SessionJob], seconds: float, headers: dict[str, str] | None
) -> list[SessionLog]:
    return asyncio.run(_run_here(base_url, clips, jobs, seconds, headers))


async def run_sessions(
    base_url: str,
    clips: list[np.ndarray],
    jobs: list[SessionJob],
    seconds: float,
    processes: int,
    headers: dict[str, str] | None = None,
) -> list[SessionLog]:
    """Every job's SessionLog, in job order; `processes` 0: the clients run on this loop.
    `headers` go with every request (e.g. an API key)."""
    if processes <= 0:
        return await _run_here(base_url, clips, jobs, seconds, headers)
    shares = [jobs[i::processes] for i in range(processes) if jobs[i::processes]]
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(len(shares), mp_context=get_context("spawn")) as pool:
        results = await asyncio.gather(
            *(loop.run_in_executor(pool, _run_in_worker, base_url, clips, share, seconds, headers) for share in shares)
        )
    by_index = {job.index: log for share, logs in zip(shares, results) for job, log in zip(share, logs)}
    return [by_index[job.index] for job in jobs]
