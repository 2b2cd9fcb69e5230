"""WebRTC plumbing with a real aiortc client against the real server and a scripted pipeline:
VAD events, storing before generation, streaming, barge-in, cancel, vanished clients."""

import asyncio

import numpy as np
import pytest

from test_server_support import SENTENCES, FakePipeline, RtcClient, ScriptedMic, silence, speech_16k

from kimiaudio.config import Config
from kimiaudio.server.app import create_app, sessions_key, store_key


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    d = tmp_path_factory.mktemp("speech")
    return [speech_16k(d, s, f"s{i}") for i, s in enumerate(SENTENCES)]


def make_config(tmp_path, **server):
    config = Config()
    config.storage.data_dir = str(tmp_path)
    config.vad.silence_ms = 400
    for key, value in server.items():
        setattr(config.server, key, value)
    return config


@pytest.fixture
async def server(aiohttp_client, tmp_path):
    async def start(pipeline=None, **server_settings):
        pipeline = pipeline or FakePipeline()
        app = create_app(make_config(tmp_path, **server_settings), stack=None, pipeline=pipeline)
        return await aiohttp_client(app), pipeline

    return start


async def test_turn_is_detected_stored_answered_and_played(server, speech):
    http, pipeline = await server()
    mic = ScriptedMic()
    client = RtcClient(mic)
    status, answer = await client.connect(http)
    assert status == 200 and answer["session_id"].startswith("sess_")
    created = await client.wait_for("session.created")
    assert created["session"]["vad"]["silence_ms"] == 400

    mic.say(np.concatenate([silence(0.3), speech[0], silence(1.0)]))
    await client.wait_for("input_audio_buffer.speech_started")
    await client.wait_for("input_audio_buffer.speech_stopped")
    committed = await client.wait_for("input_audio_buffer.committed")
    conversation_id = committed["conversation_id"]
    assert client.of_type("conversation.created")[0]["conversation"]["id"] == conversation_id
    assert committed["duration_s"] == pytest.approx(speech[0].size / 16000, abs=0.8)
    # The user turn (with audio) was in the database before the pipeline saw it.
    store = http.app[store_key]
    assert len(pipeline.requests) == 1 and pipeline.requests[0].history == []
    user_audio = pipeline.requests[0].user_audio
    assert user_audio.dtype == np.float32 and user_audio.size > speech[0].size * 0.8

    await client.wait_for("response.created")
    await client.wait_for("response.audio.started")
    done = await client.wait_for("response.done")
    assert done["response"]["status"] == "completed"
    assert done["response"]["text"] == "Hello from the fake."
    assert "commit_to_first_audio_s" in done["response"]["timings"]
    deltas = "".join(e["delta"] for e in client.of_type("response.text.delta"))
    assert deltas == "Hello from the fake."
    # Non-silent audio came back over RTP (the tone has RMS ~0.21).
    assert sum(r > 0.1 for r in client.frames_rms) >= 20

    conv = await store.get_conversation(conversation_id)
    user, assistant = conv["turns"]
    assert user["role"] == "user" and user["audio_tokens"] == [7] * 5 and user["has_audio"]
    assert assistant["text"] == "Hello from the fake." and not assistant["interrupted"]
    assert assistant["duration_s"] == pytest.approx(6 * 9600 / 24000, abs=0.01)
    items = client.of_type("conversation.item.created")
    assert [i["item"]["role"] for i in items] == ["user", "assistant"]

    # A second turn carries the history (user audio + tokens, assistant text + tokens).
    mic.say(np.concatenate([speech[1], silence(1.0)]))
    await client.wait_for("response.done", count=2)
    history = pipeline.requests[1].history
    assert [h.role for h in history] == ["user", "assistant"]
    assert history[0].audio_tokens == [7] * 5 and history[1].text == "Hello from the fake."
    await client.close()


async def test_barge_in_cancels_and_stores_truncated_interrupted_turn(server, speech):
    # Long answer: 10 chunks of 0.4 s, produced faster than real time.
    http, pipeline = await server(FakePipeline(num_chunks=10, chunk_interval_s=0.05))
    mic = ScriptedMic()
    client = RtcClient(mic)
    await client.connect(http)
    mic.say(np.concatenate([speech[0], silence(0.8)]))
    await client.wait_for("response.audio.started")
    await asyncio.sleep(0.6)
    mic.say(speech[1])  # talk over the assistant
    await client.wait_for("input_audio_buffer.speech_started", count=2)
    done = await client.wait_for("response.done")
    assert done["response"]["status"] == "cancelled"
    played_s = done["response"]["timings"]["played_s"]
    assert 0.3 < played_s < 3.0
    conversation_id = client.of_type("input_audio_buffer.committed")[0]["conversation_id"]
    turn = (await http.app[store_key].get_conversation(conversation_id))["turns"][1]
    assert turn["interrupted"] is True
    assert turn["duration_s"] == pytest.approx(played_s, abs=0.05)
    # Truncated tokens: 0.4 s chunk = 5 tokens, keep those of the audio heard.
    assert 0 < len(turn["audio_tokens"]) <= int(played_s * 12.5) + 2
    # The barge-in utterance becomes the next turn, with the interrupted turn in its history.
    await client.wait_for("response.done", count=2, timeout=30)
    assert [h.role for h in pipeline.requests[1].history] == ["user", "assistant"]
    assert pipeline.running == 0
    await client.close()


async def test_response_cancel_and_session_update(server, speech):
    http, pipeline = await server(FakePipeline(num_chunks=20, chunk_interval_s=0.3))
    mic = ScriptedMic()
    client = RtcClient(mic)
    await client.connect(http, session={"vad": {"silence_ms": 300}})
    await client.wait_for("session.created")
    client.send({"type": "session.update", "session": {"vad": {"threshold": 0.6}, "sampling": {"audio_temperature": 0.5}}})
    updated = await client.wait_for("session.updated")
    assert updated["session"]["vad"]["threshold"] == 0.6 and updated["session"]["vad"]["silence_ms"] == 300
    client.send({"type": "session.update", "session": {"vad": {"threshold": "high"}}})
    err = await client.wait_for("error")
    assert err["error"]["code"] == "invalid_value" and "vad.threshold" in err["error"]["message"]
    client.send({"type": "nope"})
    err = await client.wait_for("error", count=2)
    assert err["error"]["code"] == "unknown_event"
    client.send({"type": "conversation.select", "conversation_id": "does-not-exist"})
    err = await client.wait_for("error", count=3)
    assert err["error"]["code"] == "conversation_not_found"

    mic.say(np.concatenate([speech[0], silence(0.8)]))
    await client.wait_for("response.created")
    await client.wait_for("response.text.delta")
    client.send({"type": "response.cancel"})
    done = await client.wait_for("response.done")
    assert done["response"]["status"] == "cancelled" and pipeline.cancelled == [1]
    assert pipeline.requests[0].sampling.audio_temperature == 0.5
    await client.close()


@pytest.mark.parametrize("how", ["select", "offer"])
async def test_continue_a_stored_conversation(server, speech, how):
    http, pipeline = await server()
    store = http.app[store_key]
    conv = await store.create_conversation()
    await store.add_turn(conv["id"], "user", audio=speech[1], audio_tokens=[3, 4])
    await store.add_turn(conv["id"], "assistant", "Earlier answer.", audio_tokens=[5])
    mic = ScriptedMic()
    client = RtcClient(mic)
    if how == "offer":
        await client.connect(http, conversation_id=conv["id"])
        created = await client.wait_for("session.created")
        assert created["session"]["conversation_id"] == conv["id"]
    else:
        await client.connect(http)
        await client.wait_for("session.created")
        client.send({"type": "conversation.select", "conversation_id": conv["id"]})
        updated = await client.wait_for("session.updated")
        assert updated["session"]["conversation_id"] == conv["id"]
    mic.say(np.concatenate([speech[0], silence(0.8)]))
    await client.wait_for("response.done")
    history = pipeline.requests[0].history
    assert [h.role for h in history] == ["user", "assistant"]
    assert history[0].audio is not None and history[0].audio_tokens == [3, 4]
    assert history[1].text == "Earlier answer." and history[1].audio_tokens == [5]
    assert len((await store.get_conversation(conv["id"]))["turns"]) == 4
    await client.close()


async def test_vanished_client_leaves_nothing_behind(server, speech):
    http, pipeline = await server(FakePipeline(num_chunks=200, chunk_interval_s=0.05))
    mic = ScriptedMic()
    client = RtcClient(mic)
    await client.connect(http)
    mic.say(np.concatenate([speech[0], silence(0.8)]))
    await client.wait_for("response.audio.started")
    mic.hang()  # the client stops sending anything, without a goodbye
    sessions = http.app[sessions_key]
    for _ in range(100):
        if not sessions:
            break
        await asyncio.sleep(0.1)
    assert not sessions, "the session of a vanished client was not closed"
    assert pipeline.running == 0 and pipeline.cancelled == [1]
    conversation_id = client.of_type("input_audio_buffer.committed")[0]["conversation_id"]
    turns = (await http.app[store_key].get_conversation(conversation_id))["turns"]
    assert [t["role"] for t in turns] == ["user", "assistant"] and turns[1]["interrupted"]
    await client.close()
