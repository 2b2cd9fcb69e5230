"""The fleet end to end, with the real parts: a PostgreSQL server (tests/helpers/postgres_server.py), two
`python -m kimiaudio serve` instances on the demo checkpoint sharing it through
KIMIAUDIO_DATABASE_URL (each its own port and data dir), and HAProxy running the shipped
deploy/haproxy.cfg (addresses through its environment variables; tests/helpers/haproxy_front.py).

Sessions through HAProxy land on both instances (leastconn; told apart by their metrics'
`instance` label); an ephemeral key minted by one instance opens a call on the other, and a
hang-up reaching any instance ends it; `bench --soak --url` drives the front and its books
pass; a conversation started through one is listed by the other, and opening it through
HAProxy while it is held is 409 with Retry-After; the instance holding a conversation is
killed (-9) mid-answer; the client reconnects through HAProxy and resumes the same
conversation on the other instance once the lease has expired, its history intact with the
heard part of the cut answer; the database's foreign keys hold and no audio row
is orphaned. The killed instance restarted, the other is SIGTERMed while it answers: while it
drains, and before HAProxy's checks see it, new sessions and requests through the front land on
the instance still ready (its 503 is retried there). With no instance left up, HAProxy answers
503 itself, in the servers' error shape, with Retry-After. One module: the processes are
started once and shared by its tests, in order.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import numpy as np
import pytest
import soundfile as sf
from prometheus_client.parser import text_string_to_metric_families

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.bench.realtime_ws_client import RealtimeWsClient

from helpers.audio import silence
from helpers.demo_server import LONG_ANSWER, heard_or_done
from helpers.serve_process import ROOT, SERVE_CONFIG, free_port, start_serve, stop_serve
from helpers.waiting import eventually

pytestmark = pytest.mark.slow

LEASE_S = 4  # [storage] lease_seconds: how long a killed instance's conversation stays held
INSTANCES = ("kimi-a", "kimi-b")


def instance_config(instance: str) -> str:
    return (
        SERVE_CONFIG
        + f"""
[server]
instance_id = "{instance}"
[storage]
lease_seconds = {LEASE_S}
"""
    )


class Fleet:
    def __init__(self, database_url: str, procs: dict, ports: dict, front):
        self.database_url = database_url
        self.procs = procs  # instance id -> its serve process
        self.ports = ports  # instance id -> its port
        self.front = front

    def url(self, instance: str) -> str:
        return f"http://127.0.0.1:{self.ports[instance]}"


@pytest.fixture(scope="module")
def fleet(postgres_server, haproxy_front, tmp_path_factory):
    if not postgres_server.running:
        postgres_server.start()
    database_url = postgres_server.create_database()
    ports = {name: free_port() for name in INSTANCES}
    front = haproxy_front([f"127.0.0.1:{ports[name]}" for name in INSTANCES])

    def start(name):
        data_dir = tmp_path_factory.mktemp(name)
        return start_serve(data_dir, ports[name], instance_config(name), env={"KIMIAUDIO_DATABASE_URL": database_url})

    with ThreadPoolExecutor(len(INSTANCES)) as pool:  # both load the model at once
        futures = {name: pool.submit(start, name) for name in INSTANCES}
    started, failures = {}, []
    for name, future in futures.items():
        try:
            started[name] = future.result()
        except Exception as exc:  # (AssertionError: it did not start) the other one is stopped too
            failures.append(exc)
    if failures:
        for proc in started.values():
            stop_serve(proc)
        raise failures[0]
    try:
        with front:
            front.wait_for_states({"kimi1": "UP", "kimi2": "UP"})
            yield Fleet(database_url, started, ports, front)
    finally:
        for proc in started.values():
            if proc.poll() is None:
                stop_serve(proc)


async def sessions_active(fleet: Fleet, instance: str) -> float:
    """The instance's kimiaudio_sessions_active, read from its own /metrics (not through HAProxy),
    whose samples must carry its instance label."""
    async with aiohttp.ClientSession() as http:
        text = await (await http.get(fleet.url(instance) + "/metrics")).text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert sample.labels.get("instance") == instance, sample
            if sample.name == "kimiaudio_sessions_active":
                value = sample.value
    return value


async def wait_until_idle(fleet: Fleet, instances=INSTANCES) -> None:
    async def idle():
        return all([await sessions_active(fleet, name) == 0 for name in instances])

    await eventually(idle, "every session closed on the instances", interval=0.1)


async def test_sessions_through_the_front_land_on_both_instances(fleet):
    async with aiohttp.ClientSession(base_url=fleet.front.url) as http:
        ready = await http.get("/readyz")
        assert ready.status == 200 and (await ready.json())["instance"] in INSTANCES
        clients = []
        try:
            for _ in INSTANCES:  # a WebSocket is one connection for its life: leastconn sends the next elsewhere
                client = RealtimeWsClient()
                assert await client.connect(http) == 101  # the upgrade passes HAProxy
                await client.wait_for("session.created")
                clients.append(client)
            assert [await sessions_active(fleet, name) for name in INSTANCES] == [1, 1]
        finally:
            for client in clients:
                await client.close()
    await wait_until_idle(fleet)


async def test_keys_and_calls_work_across_instances(fleet):
    """An ephemeral key minted by one instance opens a call on the other; a hang-up reaching
    either instance, or the front, ends the call where it lives."""
    first, second = INSTANCES
    async with (
        aiohttp.ClientSession(base_url=fleet.url(first)) as at_first,
        aiohttp.ClientSession(base_url=fleet.url(second)) as at_second,
        aiohttp.ClientSession(base_url=fleet.front.url) as front,
    ):
        minted = await at_second.post("/v1/realtime/client_secrets", json={"session": {"instructions": "Fleet."}})
        key = (await minted.json())["value"]
        client = RtcClient(ScriptedMic())
        assert (await client.connect(at_first, key=key))[0] == 201
        assert (await client.wait_for("session.created"))["session"]["instructions"] == "Fleet."
        assert [await sessions_active(fleet, name) for name in INSTANCES] == [1, 0]
        assert (await at_second.post(f"/v1/realtime/calls/{client.call_id}/hangup")).status == 200
        await wait_until_idle(fleet)
        await client.close()
        through_front = RtcClient(ScriptedMic())
        assert (await through_front.connect(front, key=key))[0] == 201
        await through_front.wait_for("session.created")
        assert (await front.post(f"/v1/realtime/calls/{through_front.call_id}/hangup")).status == 200
        await wait_until_idle(fleet)
        await through_front.close()


def test_bench_soak_drives_the_front(fleet):
    """`bench --soak --url`: the soak's sessions, faults and reconnects through HAProxy (a
    reconnect may land on the other instance and wait out conversation_busy), and its books."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("KIMIAUDIO_API_KEY", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kimiaudio",
            "bench",
            "--soak",
            "--url",
            fleet.front.url,
            "--sessions",
            "2",
            "--turns",
            "2",
            "--fault-rate",
            "0.5",
            "--seconds",
            "120",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["ok"] and report["url"] == fleet.front.url, report
    assert "committed user turns not stored" in report["checks"] and "leaked KV blocks" not in report["checks"]
    assert all(n >= 1 for n in report["commits_by_transport"].values()), report["commits_by_transport"]
    assert all(report["faults"][kind] >= n for kind, n in report["planned_faults"].items()), report


async def test_a_conversation_resumes_on_the_other_instance_after_kill_9(fleet, speech):
    await wait_until_idle(fleet)  # the sessions of the tests before
    async with aiohttp.ClientSession(base_url=fleet.front.url) as http:
        client = RealtimeWsClient()
        assert await client.connect(http) == 101
        await client.wait_for("session.created")
        await client.send({"type": "session.update", "session": {"sampling": LONG_ANSWER}})
        await client.wait_for("session.updated")
        active = {name: await sessions_active(fleet, name) for name in INSTANCES}
        holder = next(name for name, n in active.items() if n == 1)
        other = next(name for name in INSTANCES if name != holder)

        for attempt in range(1, 7):  # until an answer still playing has 9 codes (> 0.64 s) stored as heard
            client.say(speech[0])
            committed = await client.wait_for("input_audio_buffer.committed", count=attempt)
            if await heard_or_done(client, http, committed["conversation_id"], attempt, 9):
                break
            await client.wait_for("response.done", count=attempt)
        else:
            raise AssertionError("no answer had 9 codes heard before it ended, in 6 attempts")
        conversation_id = committed["conversation_id"]
        async with aiohttp.ClientSession() as direct:  # started through one, listed by the other
            listed = await (await direct.get(fleet.url(other) + "/api/conversations")).json()
        assert conversation_id in [c["id"] for c in listed["conversations"]], listed

        # Held by a live session: opening it through the front is refused, and HAProxy (whose
        # leastconn sends this offer to the other instance: the holder has the WebSocket) passes
        # the 409 and its Retry-After through.
        elsewhere = RtcClient(ScriptedMic())
        status, answer = await elsewhere.connect(http, conversation_id=conversation_id)
        await elsewhere.close()
        assert status == 409 and answer["error"]["code"] == "conversation_busy", (status, answer)
        assert 1 <= int(elsewhere.response_headers["Retry-After"]) <= LEASE_S + 1

        proc = fleet.procs[holder]
        os.kill(proc.pid, signal.SIGKILL)  # mid-answer: no shutdown, no final record, the lease left behind
        proc.wait(10)
        await client.close()

        # Reconnect through HAProxy (WebRTC this time): the dead instance's refused connection
        # sends the offer to the other one, which answers 409 until the lease expires.
        busy = []

        async def reconnected():
            client = RtcClient(ScriptedMic())
            status, answer = await client.connect(http, conversation_id=conversation_id)
            if status == 201:
                return client, answer
            await client.close()
            assert status == 409 and answer["error"]["code"] == "conversation_busy", (status, answer)
            busy.append(int(client.response_headers["Retry-After"]))  # passed through HAProxy
            return None

        client, _ = await eventually(reconnected, "the conversation free again", interval=0.5)
        assert (await client.wait_for("session.created"))["session"]["conversation_id"] == conversation_id
        assert all(1 <= seconds <= LEASE_S + 1 for seconds in busy), busy
        assert await sessions_active(fleet, other) == 1
        dead = "kimi1" if holder == INSTANCES[0] else "kimi2"
        await asyncio.to_thread(fleet.front.wait_for_states, {dead: "DOWN"})

        # The history, read through the front: every turn, and the heard part of the cut answer.
        turns = (await (await http.get(f"/api/conversations/{conversation_id}")).json())["turns"]
        assert [t["role"] for t in turns] == ["user", "assistant"] * attempt, turns
        heard = turns[-1]
        assert heard["interrupted"] and heard["has_audio"] and heard["duration_s"] > 0.64, heard  # seen stored
        wav = await (await http.get(f"/api/conversations/{conversation_id}/turns/{len(turns) - 1}/audio")).read()
        pcm, rate = sf.read(io.BytesIO(wav), dtype="float32")
        assert rate == 24000 and pcm.size == round(heard["duration_s"] * rate) and np.abs(pcm).max() > 0.01

        # The conversation goes on on the other instance, the cut answer in its prompt.
        await client.wait_for("session.created")
        client.mic.say(np.concatenate([speech[1], silence(1.0)]))
        done = await client.wait_for("response.done")
        assert done["response"]["status"] in ("completed", "incomplete", "cancelled"), done

        async def both_turns():  # the assistant turn is written as its answer ends
            after = (await (await http.get(f"/api/conversations/{conversation_id}")).json())["turns"]
            return after if len(after) == len(turns) + 2 else None

        after = await eventually(both_turns, "the resumed turn and its answer stored", interval=0.1)
        assert [t["role"] for t in after] == ["user", "assistant"] * (attempt + 1), after
        assert after[len(turns) - 1]["duration_s"] == heard["duration_s"]
        # The history is in the prompt: its positions (computed here, or served by this instance's
        # prefix cache where another test spoke the same clip to it) hold every turn's speech.
        prompt = done["response"]["prefill_tokens_computed"] + done["response"]["prefill_tokens_cached"]
        assert prompt > sum(len(t["audio_tokens"]) for t in after[:-1]), (prompt, after)
        await client.close()
    await wait_until_idle(fleet, [other])
    await check_database(fleet.database_url, conversation_id, after)


async def check_database(url: str, conversation_id: str, turns: list[dict]) -> None:
    """Every foreign key holds (no row points at a missing one; the check reads the constraints
    from the catalog, so a table added later is covered), the cut answer's parts were joined
    into its WAV, the turns the API says have audio (`turns`) are those with a WAV row, and the
    lease was released."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url) as conn:
        keys = await (
            await conn.execute("""
            SELECT tc.table_name, kcu.column_name, ccu.table_name, ccu.column_name
            FROM information_schema.table_constraints tc
            JOIN information_schema.key_column_usage kcu ON kcu.constraint_name = tc.constraint_name
            JOIN information_schema.constraint_column_usage ccu ON ccu.constraint_name = tc.constraint_name
            WHERE tc.constraint_type = 'FOREIGN KEY' AND tc.table_schema = current_schema()""")
        ).fetchall()
        tables = {table for table, *_ in keys}
        assert {"turns", "turn_audio", "turn_audio_parts"} <= tables, keys  # the audio tables have their keys
        for table, column, parent, parent_column in keys:
            orphans = await (
                await conn.execute(
                    f'SELECT count(*) FROM "{table}" c LEFT JOIN "{parent}" p ON p."{parent_column}" = c."{column}" '
                    f'WHERE c."{column}" IS NOT NULL AND p."{parent_column}" IS NULL'
                )
            ).fetchone()
            assert orphans[0] == 0, f"{table}.{column} -> {parent}.{parent_column}: {orphans[0]} orphaned rows"
        parts = await (
            await conn.execute(
                "SELECT count(*) FROM turn_audio_parts p JOIN turns t ON t.id = p.turn_id WHERE t.conversation_id = %s",
                [conversation_id],
            )
        ).fetchone()
        assert parts[0] == 0, "the cut answer's heard parts were not joined"
        stored = await (
            await conn.execute(
                "SELECT t.turn_index, a.turn_id IS NOT NULL FROM turns t LEFT JOIN turn_audio a ON a.turn_id = t.id "
                "WHERE t.conversation_id = %s ORDER BY t.turn_index",
                [conversation_id],
            )
        ).fetchall()
        assert [tuple(row) for row in stored] == [(t["index"], t["has_audio"]) for t in turns], (stored, turns)
        assert all(t["has_audio"] for t in turns[-3:]), turns[-3:]  # the cut answer, the next utterance and answer

        async def released():  # the closed session's lease is released as it closes
            held = await (
                await conn.execute("SELECT count(*) FROM leases WHERE conversation_id = %s", [conversation_id])
            ).fetchone()
            return held[0] == 0

        await eventually(released, "the closed session's lease released", interval=0.1)


async def test_new_sessions_skip_an_instance_that_drains(fleet, speech, tmp_path_factory):
    """SIGTERM an instance while it answers: it drains (/readyz 503, new work refused 503
    shutting_down) for as long as its answer plays, and HAProxy's checks take up to 4 s to see
    it. Meanwhile leastconn still picks it (it holds fewer connections through the front), and
    HAProxy retries its 503 on the other instance: a new WebSocket session, a WebRTC offer (a
    POST with a body) and a request through the front land there at once."""
    for name, proc in fleet.procs.items():  # the instance killed (-9) before comes back
        if proc.poll() is not None:
            config, env = instance_config(name), {"KIMIAUDIO_DATABASE_URL": fleet.database_url}
            data_dir = tmp_path_factory.mktemp(name)
            fleet.procs[name] = await asyncio.to_thread(start_serve, data_dir, fleet.ports[name], config, env)
    await asyncio.to_thread(fleet.front.wait_for_states, {"kimi1": "UP", "kimi2": "UP"})
    await wait_until_idle(fleet)
    async with aiohttp.ClientSession(base_url=fleet.front.url) as http:
        first = RealtimeWsClient()  # through the front: the instance holding it is `other`
        assert await first.connect(http) == 101
        await first.wait_for("session.created")
        active = {name: await sessions_active(fleet, name) for name in INSTANCES}
        other = next(name for name, n in active.items() if n == 1)
        draining = next(name for name in INSTANCES if name != other)
        server = f"kimi{INSTANCES.index(draining) + 1}"
        async with aiohttp.ClientSession(base_url=fleet.url(draining)) as direct:
            # Straight to the instance, not through the front: leastconn sees it idle.
            answering = RealtimeWsClient()
            assert await answering.connect(direct) == 101
            await answering.wait_for("session.created")
            await answering.send({"type": "session.update", "session": {"sampling": LONG_ANSWER}})
            await answering.wait_for("session.updated")
            for attempt in range(1, 7):  # until an answer still playing has 9 codes heard: its drain lasts
                answering.say(speech[0])
                committed = await answering.wait_for("input_audio_buffer.committed", count=attempt)
                if await heard_or_done(answering, direct, committed["conversation_id"], attempt, 9):
                    break
                await answering.wait_for("response.done", count=attempt)
            else:
                raise AssertionError("no answer had 9 codes heard before it ended, in 6 attempts")

            fleet.procs[draining].send_signal(signal.SIGTERM)

            async def not_ready():
                return (await direct.get("/readyz")).status == 503

            await eventually(not_ready, "the instance draining", interval=0.05)
            assert fleet.front.states()[server].startswith("UP")  # the checks have not seen it yet
            probe = RealtimeWsClient()
            assert await probe.connect(http) == 101  # the old config answered the drain's 503
            await probe.wait_for("session.created")
            assert await sessions_active(fleet, other) == 2
            offer = RtcClient(ScriptedMic())
            status, answer = await offer.connect(http)
            assert status == 201, (status, answer)
            await offer.wait_for("session.created")
            assert await sessions_active(fleet, other) == 3
            ready = await http.get("/readyz")  # a plain request: the draining one answers 503 too
            assert ready.status == 200 and (await ready.json())["instance"] == other
            assert fleet.procs[draining].poll() is None  # it was draining all along
            for client in (probe, offer, first, answering):
                await client.close()
    assert await asyncio.to_thread(fleet.procs[draining].wait, 60) == 0
    await wait_until_idle(fleet, [other])


async def test_with_no_instance_up_the_front_answers_503_with_retry_after(fleet):
    """The last instance stops (SIGTERM: /readyz 503, then gone): HAProxy answers itself, in
    the servers' JSON error shape, with Retry-After."""
    for proc in fleet.procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    await asyncio.to_thread(fleet.front.wait_for_states, {"kimi1": "DOWN", "kimi2": "DOWN"})
    async with aiohttp.ClientSession(base_url=fleet.front.url) as http:
        resp = await http.get("/v1/models")
        body = await resp.json(content_type=None)
    assert resp.status == 503 and resp.headers["Retry-After"] == "10", (resp.status, body)
    assert body["error"]["code"] == "no_instance_ready" and "try again" in body["error"]["message"]
    for proc in fleet.procs.values():
        assert proc.wait(30) in (0, -signal.SIGKILL)  # the one stopped by SIGTERM exits 0
