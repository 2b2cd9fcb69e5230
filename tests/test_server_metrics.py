"""Metrics, health and logs of the real server (demo checkpoint, real aiortc client):
/metrics in Prometheus format with non-zero latency histograms after a turn, /healthz and
/readyz (503 when full or draining), every sample labelled with its instance, the answer audio
generated counted once whatever carries it (WebRTC, the Realtime WebSocket and chat completions
with the official `openai` client), one structured log line per answer, libraries kept quiet
and client faults kept to one INFO line."""

import asyncio
import base64
import logging

import numpy as np
import pytest

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.bench.realtime_ws_client import RealtimeWsClient
from kimiaudio.server.context import SERVER_CONTEXT
from kimiaudio.server.observe.log_setup import configure_logging
from kimiaudio.server.transport.audio_track import MeteredPlaybackTrack

from helpers.audio import silence
from helpers.demo_server import kv_pool_full_again
from helpers.metrics_scrape import scrape
from helpers.playback import ListenerLog
from helpers.realtime_events import MODEL, Events, say
from helpers.waiting import eventually

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
async def server(demo_server):
    async with demo_server() as started:
        yield started


async def test_metrics_after_a_turn(server, speech, caplog):
    http, pipeline = server
    caplog.set_level(logging.INFO, logger="kimiaudio.turns")
    before = await scrape(http)
    assert before["kimiaudio_sessions_active"] == 0 and before["kimiaudio_lm_step_seconds_count"] == 0
    client = RtcClient(ScriptedMic())
    assert (await client.connect(http))[0] == 201
    client.mic.say(np.concatenate([speech[0], silence(1.0)]))
    done = await client.wait_for("response.done")
    assert done["response"]["status"] in ("completed", "incomplete")
    await http.post("/api/rtc/offer", data="[" * 100, headers={"Content-Type": "application/json"})
    m = await scrape(http)
    assert m["kimiaudio_sessions_total{transport=webrtc}"] == 1 and m["kimiaudio_sessions_active"] == 1
    answered = sum(m.get(f"kimiaudio_responses_total{{status={s}}}", 0) for s in ("completed", "incomplete"))
    assert answered == 1 and m["kimiaudio_turns_total{status=completed}"] == 1
    # The user's words ([server] transcribe_input) are counted apart, out of the answers' figures.
    assert m["kimiaudio_background_turns_total{status=completed}"] <= 1
    for stage in ("queued", "encoded", "prefill_done", "first_audio_token", "first_pcm", "done"):
        assert m[f"kimiaudio_turn_stage_seconds_count{{stage={stage}}}"] == 1, stage
        assert m[f"kimiaudio_turn_stage_seconds_sum{{stage={stage}}}"] > 0, stage
    first = m["kimiaudio_commit_to_first_packet_seconds_sum"]
    assert m["kimiaudio_commit_to_first_packet_seconds_count"] == 1
    assert first == pytest.approx(done["response"]["timings"]["commit_to_first_audio_s"], abs=1e-3)
    for name in (
        "kimiaudio_lm_step_seconds",
        "kimiaudio_lm_batch_size",
        "kimiaudio_encode_batch_seconds",
        "kimiaudio_detok_batch_seconds",
    ):
        assert m[f"{name}_count"] > 0 and m[f"{name}_sum"] > 0, name
        buckets = [v for k, v in m.items() if k.startswith(f"{name}_bucket@")]
        assert buckets == sorted(buckets) and buckets[-1] == m[f"{name}_count"], name  # cumulative, +Inf last
    assert m["kimiaudio_prefill_tokens_total{cache=miss}"] > 0 and m["kimiaudio_decode_tokens_total"] > 0
    assert m["kimiaudio_audio_generated_seconds_total"] > 0 and m["kimiaudio_detok_chunks_total"] > 0
    assert m["kimiaudio_kv_blocks{state=free}"] + m["kimiaudio_kv_blocks{state=used}"] == 256
    assert m["kimiaudio_errors_total{kind=invalid_json,source=http}"] == 1
    assert "kimiaudio_playback_underruns_total" in m and "kimiaudio_preemptions_total" in m
    assert "kimiaudio_gc_pause_seconds_count" in m and m["kimiaudio_detok_graph_captures_total"] == 0  # no graphs

    lines = [r.getMessage() for r in caplog.records if r.name == "kimiaudio.turns"]
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("turn session=sess_") and f"response={done['response']['id']}" in line
    conversation_id = client.of_type("input_audio_buffer.committed")[0]["conversation_id"]
    for part in (
        f"conversation={conversation_id}",
        "commit_to_first_audio_s=",
        "done_s=",
        "prefill_tokens_computed=",
        "text_chars=",
    ):
        assert part in line, (part, line)
    assert f"status={done['response']['status']}" in line, line
    await client.close()
    await kv_pool_full_again(pipeline)


async def test_health_and_readiness(server):
    http, _ = server
    assert (await http.get("/healthz")).status == 200
    ready = await http.get("/readyz")
    assert ready.status == 200 and (await ready.json())["status"] == "ready"
    http.app[SERVER_CONTEXT].sessions.is_draining = True
    resp = await http.get("/readyz")
    assert resp.status == 503 and "shutting down" in (await resp.json())["problems"]
    http.app[SERVER_CONTEXT].sessions.is_draining = False


async def test_readiness_fails_while_full_so_a_router_sends_new_sessions_elsewhere(demo_server):
    async with demo_server(max_sessions=1) as (http, _):
        client = RealtimeWsClient()
        assert await client.connect(http) == 101
        await client.wait_for("session.created")
        resp = await http.get("/readyz")
        body = await resp.json()
        assert resp.status == 503 and body["problems"] == ["full: 1 of 1 sessions"], body
        assert body["sessions"] == {"active": 1, "max": 1}
        assert (await http.post("/api/rtc/offer", json={})).status == 503  # what the probe foretold
        await client.close()

        async def ready():  # the slot is released as the socket's session closes
            resp = await http.get("/readyz")
            return resp if resp.status == 200 else None

        resp = await eventually(ready, "/readyz 200 once the session closed")
        assert (await resp.json())["problems"] == []


async def test_every_sample_carries_the_configured_instance_label(demo_server):
    async with demo_server(instance_id="gpu-node-1.cuda-0") as (http, _):
        m = await scrape(http, instance="gpu-node-1.cuda-0")  # asserts the label on every sample
        assert m["kimiaudio_sessions_active"] == 0 and "kimiaudio_lm_step_seconds_count" in m
        assert (await (await http.get("/readyz")).json())["instance"] == "gpu-node-1.cuda-0"
        # The registry itself stays unlabelled: code reading a sample back names it as before.
        assert http.app[SERVER_CONTEXT].metrics.registry.get_sample_value("kimiaudio_sessions_active") == 0


async def test_client_faults_and_library_chatter_stay_out_of_the_error_log(server, speech, caplog):
    http, pipeline = server
    root = logging.getLogger()
    level = root.level
    configure_logging("INFO")
    try:
        assert logging.getLogger("aioice").getEffectiveLevel() == logging.WARNING
        caplog.set_level(logging.INFO)
        for garbage in (
            b"GARBAGE\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"\x16\x03\x01\x00\xa5\x01\x00",
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", http.server.port)
            writer.write(garbage)
            assert (await reader.read(12)).startswith(b"HTTP/1.")
            writer.close()
        # What aiortc leaves behind when a peer has just gone: a send task that failed, never awaited.
        loop = asyncio.get_running_loop()
        loop.call_exception_handler(
            {
                "message": "Task exception was never retrieved",
                "exception": ConnectionError("Cannot send data, not connected"),
            }
        )
        from OpenSSL import SSL  # aiortc's SCTP send on a DTLS session the peer has just shut

        loop.call_exception_handler(
            {
                "message": "Task exception was never retrieved",
                "exception": SSL.Error([("SSL routines", "", "protocol is shutdown")]),
            }
        )
        client = RtcClient(ScriptedMic())
        assert (await client.connect(http))[0] == 201
        client.mic.say(np.concatenate([speech[0], silence(1.0)]))
        await client.wait_for("output_audio_buffer.started")
        await client.close()  # hang up mid-answer

        async def session_closed():
            return any("closed:" in r.getMessage() for r in caplog.records)

        await eventually(session_closed, "the session's 'closed:' log line")
        await kv_pool_full_again(pipeline)
    finally:
        root.setLevel(level)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    # aiohttp logs the over-long header and the bad Content-Length (the others at DEBUG): one line each.
    assert sum("Error handling request" in r.getMessage() for r in caplog.records) == 2
    assert sum("closed:" in r.getMessage() for r in caplog.records if r.name.startswith("kimiaudio")) == 1
    assert any(r.name == "asyncio" and "never retrieved: Cannot send data" in r.getMessage() for r in caplog.records)
    assert any(r.name == "asyncio" and "protocol is shutdown" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.name.startswith("aioice") and r.levelno < logging.WARNING]


async def test_underruns_are_counted_once_per_gap():
    counted: list[int] = []
    track = MeteredPlaybackTrack(on_underrun=lambda: counted.append(1))
    track.begin("resp_1", ListenerLog())
    track.push(np.full(4800, 0.1, np.float32))  # 0.2 s, then the generator is late: one gap
    for _ in range(20):
        await track.recv()
    track.push(np.full(4800, 0.1, np.float32))  # late audio resumes playback; it runs dry again
    for _ in range(20):
        await track.recv()
    track.push(np.full(2400, 0.1, np.float32))
    track.end()  # the answer's last frames: running out at its end is not a gap
    for _ in range(10):
        await track.recv()
    assert len(counted) == 2
    track.stop()


# The client's audio and the count are the same samples (pcm16 both ways): well within one
# detokenizer chunk (0.08 s a code).
SAME_AUDIO_S = 1e-3


async def audio_generated(http) -> float:
    return (await scrape(http))["kimiaudio_audio_generated_seconds_total"]


def pcm16_seconds(b64: str) -> float:
    return len(base64.b64decode(b64)) / 2 / 24000


async def test_audio_generated_counts_spoken_answers_over_the_websocket_and_chat(server, speech):
    """Each spoken answer raises kimiaudio_audio_generated_seconds_total by the audio its client
    received, whatever carried it: a Realtime WebSocket turn, a chat completion, one streamed."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
    http, pipeline = server
    base = f"http://127.0.0.1:{http.server.port}"
    client = openai.AsyncOpenAI(
        base_url=f"{base}/v1",
        api_key="unused",
        max_retries=0,
        websocket_base_url=f"ws://127.0.0.1:{http.server.port}/v1",
    )
    try:
        before = await audio_generated(http)
        async with client.realtime.connect(model=MODEL) as conn:
            events = Events(conn, "ga")
            await events.wait_for("session.created")
            await say(conn, np.concatenate([speech[0], silence(1.0)]))  # server VAD ends the turn
            done = await events.wait_for("response.done")
            received = events.audio_seconds(done.response.id)
        after = await audio_generated(http)
        assert received > 0 and after - before == pytest.approx(received, abs=SAME_AUDIO_S)

        spoken = {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}
        question = [{"role": "user", "content": "Say something."}]
        before = after
        completion = await client.chat.completions.create(model=MODEL, messages=question, **spoken)
        received = pcm16_seconds(completion.choices[0].message.audio.data)
        after = await audio_generated(http)
        assert received > 0 and after - before == pytest.approx(received, abs=SAME_AUDIO_S)

        before = after
        stream = await client.chat.completions.create(model=MODEL, messages=question, stream=True, **spoken)
        received = 0.0
        async for chunk in stream:
            audio = chunk.choices[0].delta.audio if chunk.choices else None
            if audio is not None and audio.data:
                received += pcm16_seconds(audio.data)
        after = await audio_generated(http)
        assert received > 0 and after - before == pytest.approx(received, abs=SAME_AUDIO_S)
    finally:
        await client.close()
    await kv_pool_full_again(pipeline)


async def test_readiness_fails_once_a_model_worker_has_stopped(server, speech, monkeypatch):
    """A worker whose loop broke cannot serve again: /readyz says so, so that an orchestrator
    restarts the process (the turn in flight ended failed; new ones are refused)."""
    from kimiaudio.engine.llm_engine import LLMEngine
    from kimiaudio.pipeline.turn_request import TurnRequest

    from helpers.worker_faults import Broken

    def step(self):
        raise Broken("injected")

    http, pipeline = server
    monkeypatch.setattr(LLMEngine, "step", step)
    events = [event async for event in pipeline.submit(TurnRequest("c", [], speech[0]))]
    assert events[-1].status == "failed" and "kimiaudio-lm worker stopped" in events[-1].error
    resp = await http.get("/readyz")
    body = await resp.json()
    assert resp.status == 503 and body["problems"] == ["the model workers stopped (see the server log)"]
