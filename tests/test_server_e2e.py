"""End to end with the real pipeline on the demo checkpoint: a real aiortc client speaks,
the server detects, stores, generates, streams and plays; history is reused from the KV
prefix cache; barge-in cancels and frees the KV pool; two clients are served at once."""

import asyncio
import io

import numpy as np
import pytest
import soundfile as sf

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.server.context import SERVER_CONTEXT

from helpers.audio import silence
from helpers.demo_server import kv_pool_full_again

pytestmark = pytest.mark.slow


@pytest.fixture
async def server(demo_server):
    async with demo_server() as started:
        yield started


async def test_two_turns_with_history_reuse(server, speech):
    http, pipeline = server
    mic = ScriptedMic()
    client = RtcClient(mic)
    assert (await client.connect(http))[0] == 201
    status = await (await http.get("/api/status")).json()
    assert status["demo_weights"] is True and "random weights" in status["demo_message"]

    mic.say(np.concatenate([speech[0], silence(1.0)]))
    for kind in (
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "response.created",
        "response.output_audio_transcript.delta",
        "output_audio_buffer.started",
    ):
        await client.wait_for(kind)
    done = await client.wait_for("response.done")
    assert done["response"]["status"] in ("completed", "incomplete"), done
    timings = done["response"]["timings"]
    assert 0 < timings["commit_to_first_audio_s"] < 120 and "first_pcm_s" in timings  # a duration, however slow
    # The random demo weights may end the text at once, so the deltas are compared with
    # the final text rather than required to be non-empty.
    text = "".join(e["delta"] for e in client.of_type("response.output_audio_transcript.delta"))
    assert text == done["response"]["text"]

    conversation_id = client.of_type("input_audio_buffer.committed")[0]["conversation_id"]
    store = http.app[SERVER_CONTEXT].store
    user, assistant = (await store.get_conversation(conversation_id))["turns"]
    assert user["role"] == "user" and user["has_audio"] and user["audio_tokens"]
    assert assistant["text"] == text and assistant["audio_tokens"] and not assistant["interrupted"]
    # The generated speech came back over WebRTC: most of its 20 ms frames are not silent.
    loud = sum(r > 0.01 for r in client.frames_rms)
    assert loud >= 0.5 * assistant["duration_s"] / 0.02 and loud >= 5, (loud, assistant["duration_s"])
    wav = await (await http.get(f"/api/conversations/{conversation_id}/turns/1/audio")).read()
    pcm, sr = sf.read(io.BytesIO(wav), dtype="float32")
    # All of the reply was saved: the audio of every one of its codes, whatever its length (the
    # random demo weights, fed the VAD's cut of the utterance, once answered with 0.4 s).
    detokenizer = pipeline.stack.detokenizer
    assert sr == detokenizer.sample_rate
    assert pcm.size == len(assistant["audio_tokens"]) * detokenizer.samples_per_token > 0
    assert np.sqrt(np.mean(pcm**2)) > 0.01

    # Second turn: the history (first user + assistant turn) comes from the prefix cache.
    mic.say(np.concatenate([speech[1], silence(1.0)]))
    second = await client.wait_for("response.done", count=2)
    assert second["response"]["status"] in ("completed", "incomplete")
    assert second["response"]["prefill_tokens_cached"] > 0, second
    assert len((await store.get_conversation(conversation_id))["turns"]) == 4
    await client.close()
    await kv_pool_full_again(pipeline)


async def test_barge_in_with_the_real_pipeline(server, speech):
    http, pipeline = server
    mic = ScriptedMic()
    client = RtcClient(mic)
    await client.connect(http, session={"vad": {"min_speech_ms": 100}})
    pipeline.answers_to_limit = True  # (the demo weights sometimes answer with very little audio)
    mic.say(np.concatenate([speech[0], silence(0.8)]))
    # Talk as soon as the answer starts playing. An answer over before the cut-in is heard (a
    # loaded machine delays the microphone's frames) makes the cut-in the next turn, and the
    # test talks over that answer instead.
    for attempt in range(1, 4):
        await client.wait_for("output_audio_buffer.started", count=attempt)
        mic.say(np.concatenate([speech[1], silence(0.8)]))
        done = await client.wait_for("response.done", count=attempt)
        if done["response"]["status"] == "cancelled":
            break
    assert done["response"]["status"] == "cancelled", client.of_type("response.done")
    conversation_id = client.of_type("input_audio_buffer.committed")[0]["conversation_id"]
    turns = (await http.app[SERVER_CONTEXT].store.get_conversation(conversation_id))["turns"]
    interrupted = [t for t in turns if t["interrupted"]]
    assert len(interrupted) == 1 and interrupted[0]["role"] == "assistant"
    assert interrupted[0]["duration_s"] == pytest.approx(done["response"]["timings"]["played_s"], abs=0.05)
    # The interrupting utterance is answered in turn.
    after = await client.wait_for("response.done", count=attempt + 1)
    assert after["response"]["status"] in ("completed", "incomplete", "cancelled")
    await client.close()
    await kv_pool_full_again(pipeline)


async def test_two_clients_at_once(server, speech):
    http, pipeline = server
    clients = [RtcClient(ScriptedMic()) for _ in range(2)]
    for client in clients:
        assert (await client.connect(http))[0] == 201
    for client, clip in zip(clients, speech):
        client.mic.say(np.concatenate([clip, silence(1.0)]))
    dones = await asyncio.gather(*(c.wait_for("response.done") for c in clients))
    assert all(d["response"]["status"] in ("completed", "incomplete") for d in dones) and len(dones) == 2
    ids = {c.of_type("input_audio_buffer.committed")[0]["conversation_id"] for c in clients}
    assert len(ids) == 2
    for client in clients:
        await client.close()
    await kv_pool_full_again(pipeline)
