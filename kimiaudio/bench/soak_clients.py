"""The soak's sessions: real loopback clients speaking turns, with faults on purpose.

Each session follows a plan, one entry per turn: `none` (speak, wait for the answer),
`barge_in` (speak over the answer while it plays), `disconnect` (hang up while the answer
plays, then reconnect and continue the same conversation), `malformed` (send a broken event
first, expect an `error` event, then speak). What the client saw is kept in a SessionLog: the
user turns committed (to look for in the store), every response created and its final status,
the responses its own hang-ups abandoned, and what went wrong on the client's side.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FAULTS = ("none", "barge_in", "disconnect", "malformed")
TURN_TIMEOUT_S = 120.0
SILENCE_S = 1.2  # after an utterance: longer than the VAD's end-of-speech silence
MALFORMED = (
    "[" * 5000,
    "{not json",
    '{"type": "nope"}',
    '{"type": "session.update", "session": {"vad": "fast"}}',
    # (a wrong type in a known field, or a field OpenAI's API does not have, is what is malformed)
    '{"type": "response.cancel", "response_id": [1, 2, 3]}',
    '{"type": "session.update", "session": {"vad": {"threshold": 1e400}}}',
    '"\\ud800"',
    "x" * 70000,
    '{"type": ["conversation.select"]}',
)


@dataclass(frozen=True)
class Transport:
    """How the soak talks through one kind of client (RtcClient or RealtimeWsClient)."""

    name: str
    # (conversation id to continue, the session's log) -> client, or None if refused; each wait
    # for a conversation still held (conversation_busy) counts in log.busy_waits
    connect: Callable[[str | None, SessionLog], Awaitable[Any]]
    say: Callable[[Any, np.ndarray], None]  # speak 16 kHz audio (then silence) into the client, in real time
    send_raw: Callable[[Any, str], Awaitable[None]]  # one raw text message on its event channel
    is_connected: Callable[[Any], bool]  # False once the server (or the network) has closed the connection


@dataclass
class SessionLog:
    transport: str
    commits: list[tuple[str | None, int | None]] = field(default_factory=list)  # (conversation id, item index)
    responses: dict[str, str | None] = field(default_factory=dict)  # response id -> final status (None: none)
    abandoned: set[str] = field(default_factory=set)  # responses our own hang-up cut off
    faults: Counter = field(default_factory=Counter)
    first_audio_s: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # client-side: timeouts, refused connections
    busy_waits: int = 0  # reconnects that found their conversation still held (conversation_busy) and waited

    def collect(self, client) -> None:
        """Take what one connection saw (a session may use several: it reconnects)."""
        for event in client.of_type("input_audio_buffer.committed"):
            self.commits.append((event.get("conversation_id"), event.get("item_index")))
        for event in client.of_type("response.created"):
            self.responses.setdefault(event["response"]["id"], None)
        for event in client.of_type("response.done"):
            self.responses[event["response"]["id"]] = event["response"].get("status")
            first = (event["response"].get("timings") or {}).get("commit_to_first_audio_s")
            if first is not None:
                self.first_audio_s.append(first)


def plan_faults(sessions: int, turns: int, fault_rate: float, rng: random.Random) -> list[list[str]]:
    """Per session, per turn, the fault to inject; each kind appears at least once if there is room."""
    slots = [(s, t) for s in range(sessions) for t in range(turns)]
    plan = [["none"] * turns for _ in range(sessions)]
    rng.shuffle(slots)
    forced = list(FAULTS[1:]) if fault_rate > 0 else []
    for i, (s, t) in enumerate(slots):
        if i < len(forced):
            plan[s][t] = forced[i]
        elif rng.random() < fault_rate:
            plan[s][t] = rng.choice(FAULTS[1:])
    return plan


async def _wait_any(transport: Transport, client, checks, timeout: float) -> bool:
    """Whether one of `checks` came true in time; ConnectionError if the connection closed first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(check() for check in checks):
            return True
        if not transport.is_connected(client):
            raise ConnectionError("the connection closed (by the server, or ICE/DTLS failed)")
        await asyncio.sleep(0.05)
    return False


def _done(client, response_id: str):
    return lambda: any(e["response"]["id"] == response_id for e in client.of_type("response.done"))


def _playing(client, response_id: str):
    """The answer is being heard: the data channel's output_audio_buffer.started, or a WebSocket audio delta."""
    kinds = ("output_audio_buffer.started", "response.audio.delta", "response.output_audio.delta")
    return lambda: any(e.get("response_id") == response_id for kind in kinds for e in client.of_type(kind))


async def _malformed(transport: Transport, client, log: SessionLog, rng: random.Random) -> None:
    errors = len(client.of_type("error"))
    event = rng.choice(MALFORMED)
    await transport.send_raw(client, event)
    log.faults["malformed"] += 1
    if not await _wait_any(transport, client, [lambda: len(client.of_type("error")) > errors], 10.0):
        log.problems.append(
            f"a malformed event got no error event in 10 s ({transport.name}: {event[:40]!r}, {len(event)} chars)"
        )


async def run_session(
    transport: Transport,
    clips: list[np.ndarray],
    faults: list[str],
    deadline: float,
    log: SessionLog,
    rng: random.Random,
) -> None:
    """Drive one session through `faults` (one per turn) until done or `deadline`."""
    client = await transport.connect(None, log)
    if client is None:
        log.problems.append("could not connect")
        return
    try:
        for fault in faults:
            if time.monotonic() > deadline:
                break
            try:
                if fault == "malformed":
                    await _malformed(transport, client, log, rng)
                client = await _turn(transport, client, clips, fault, log, rng)
            except Exception as exc:  # e.g. the server closed the session: noted, and the session goes on
                log.problems.append(f"connection lost ({type(exc).__name__}: {exc})")
                log.abandoned |= _open_responses(client)
                log.collect(client)
                await client.close()
                client = await transport.connect(_last_conversation(client), log)
            if client is None:
                log.problems.append("could not reconnect")
                return
    finally:
        if client is not None:
            log.collect(client)
            await client.close()


async def _next_response(transport: Transport, client, created: int, log: SessionLog) -> str | None:
    """The id of the response after the `created` ones so far (None: none came in time)."""
    if not await _wait_any(
        transport, client, [lambda: len(client.of_type("response.created")) > created], TURN_TIMEOUT_S
    ):
        log.problems.append(f"no response in {TURN_TIMEOUT_S:.0f} s")
        return None
    return client.of_type("response.created")[created]["response"]["id"]


def _open_responses(client) -> set[str]:
    done = {e["response"]["id"] for e in client.of_type("response.done")}
    return {e["response"]["id"] for e in client.of_type("response.created")} - done


async def _turn(transport: Transport, client, clips, fault: str, log: SessionLog, rng: random.Random):
    created = len(client.of_type("response.created"))
    transport.say(client, clips[rng.randrange(len(clips))])
    rid = await _next_response(transport, client, created, log)
    if rid is None:
        return client
    if fault in ("barge_in", "disconnect"):
        await _wait_any(transport, client, [_playing(client, rid), _done(client, rid)], TURN_TIMEOUT_S)
        await asyncio.sleep(rng.uniform(0.1, 0.6))
    if fault == "disconnect":
        log.abandoned |= _open_responses(client)  # our hang-up ends them: the client hears no more
        conversation_id = _last_conversation(client)
        log.collect(client)
        await client.close()
        log.faults["disconnect"] += 1
        return await transport.connect(conversation_id, log)
    if fault == "barge_in":
        log.faults["barge_in"] += 1
        transport.say(client, clips[rng.randrange(len(clips))])
        if not await _wait_any(transport, client, [_done(client, rid)], TURN_TIMEOUT_S):
            log.problems.append(f"{rid}: no response.done after a barge-in")
            return client
        rid = await _next_response(transport, client, created + 1, log)  # the barge-in utterance is answered next
        if rid is None:
            return client
    if not await _wait_any(transport, client, [lambda: not _open_responses(client)], TURN_TIMEOUT_S):
        log.problems.append(
            f"responses {sorted(_open_responses(client))} got no response.done in {TURN_TIMEOUT_S:.0f} s"
        )
    return client


def _last_conversation(client) -> str | None:
    for event in reversed(client.of_type("input_audio_buffer.committed")):
        if event.get("conversation_id"):
            return event["conversation_id"]
    return None
