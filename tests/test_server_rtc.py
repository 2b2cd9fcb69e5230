"""WebRTC plumbing with a real aiortc client against the real server and the real pipeline on
the demo checkpoint: VAD events, storing before generation, streaming, barge-in, cancel,
vanished clients. The demo weights answer with seeded noise, so the assertions are about
what the pipeline produced, not about particular words."""

import contextlib

import aioice.ice
import numpy as np
import pytest

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.server.context import SERVER_CONTEXT
from kimiaudio.server.transport import microphone_in
from kimiaudio.server.transport.event_too_large import too_large_error

from helpers.audio import silence
from helpers.demo_server import LONG_ANSWER, heard_or_done, kv_pool_full_again
from helpers.openai_strict import check
from helpers.waiting import eventually

SECONDS_PER_CODE = 0.08  # the detokenizer makes 80 ms of 24 kHz audio per VQ code


@pytest.fixture
async def server(demo_server):
    """start(**server settings) -> (test client, RecordingPipeline); stopped after the test."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(**server_settings):
            return await stack.enter_async_context(demo_server(**server_settings))

        yield start


async def long_answer_playing(client, pipeline, mic, clip, seconds: float) -> int:
    """Say `clip` (one user turn per attempt) until the answer has at least `seconds` of audio,
    and return the attempt number once that answer has been generated (faster than real
    time) and is playing. The pipeline runs answers to their max_new_tokens (answers_to_limit),
    so the first attempt is long enough unless the sampling's limit is too short; a short
    answer is let finish and the user speaks again."""
    pipeline.answers_to_limit = True
    for attempt in range(1, 7):
        mic.say(np.concatenate([clip, silence(0.8)]))
        created = await client.wait_for("response.created", count=attempt)
        handle = pipeline.handles[attempt - 1]

        async def generated():  # (encoding and prefill included; on a loaded machine they take seconds)
            return handle.done is not None

        await eventually(generated, "the demo answer generated", interval=0.02)
        if len(handle.done.audio_tokens) * SECONDS_PER_CODE >= seconds:
            # An answer with no audio at all (the demo weights sometimes stop at once) never starts playing.
            rid = created["response"]["id"]
            await client.wait_for("output_audio_buffer.started", where=lambda e: e["response_id"] == rid)
            return attempt
        await client.wait_for("response.done", count=attempt)
    raise AssertionError(f"no answer of {seconds} s in 6 attempts: {client.of_type('response.done')}")


async def test_turn_is_detected_stored_answered_and_played(server, speech):
    http, pipeline = await server()
    # An answer with speech whatever the random weights make of this input (some stop at once).
    pipeline.answers_to_limit = True
    mic = ScriptedMic()
    client = RtcClient(mic)
    status, answer = await client.connect(http)
    assert status == 201 and answer["call_id"].startswith("rtc_")
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
    store = http.app[SERVER_CONTEXT].store
    assert len(pipeline.requests) == 1 and pipeline.requests[0].history == []
    user_audio = pipeline.requests[0].user_audio
    assert user_audio.dtype == np.float32 and user_audio.size > speech[0].size * 0.8

    await client.wait_for("response.created")
    await client.wait_for("output_audio_buffer.started")
    done = await client.wait_for("response.done")
    assert done["response"]["status"] in ("completed", "incomplete"), done
    assert "commit_to_first_audio_s" in done["response"]["timings"]
    # What was streamed is what was generated and stored (the demo text may be empty).
    text = done["response"]["text"]
    assert "".join(e["delta"] for e in client.of_type("response.output_audio_transcript.delta")) == text

    conv = await store.get_conversation(conversation_id)
    user, assistant = conv["turns"]
    assert user["role"] == "user" and user["has_audio"] and len(user["audio_tokens"]) > 10
    assert assistant["text"] == text and not assistant["interrupted"] and assistant["audio_tokens"]
    assert assistant["duration_s"] == pytest.approx(len(assistant["audio_tokens"]) * SECONDS_PER_CODE, abs=0.01)

    # The generated (noise) speech came back over RTP: most of its 20 ms frames are not silent
    # (waited for: the last frames may still be on their way when response.done comes).
    async def loud_frames():
        loud = sum(r > 0.01 for r in client.frames_rms)
        return loud >= 0.5 * assistant["duration_s"] / 0.02 and loud >= 3

    await eventually(loud_frames, f"half of the {assistant['duration_s']} s answer received as loud frames")
    items = client.of_type("conversation.item.added")
    assert [i["item"]["role"] for i in items] == ["user", "assistant"]
    # The page's sessions transcribe the user's words ([server] transcribe_input): the same
    # utterance as a background-priority ASR turn, encoded once for both, its words stored.
    words = await client.wait_for("conversation.item.input_audio_transcription.completed", timeout=300)
    assert words["item_id"] == committed["item_id"] and words["content_index"] == 0
    ((asr, asr_handle),) = pipeline.transcriptions
    assert asr.user_audio is pipeline.requests[0].user_audio and asr.output_type == "text"
    assert asr_handle.done.status == "completed" and words["transcript"] == asr_handle.done.text.strip()
    assert pipeline.metrics.encode_batch_s.count == 1 and pipeline.metrics.max_batch["encode"] == 1
    assert (await store.get_conversation(conversation_id))["turns"][0]["transcript"] == words["transcript"]

    # A second turn carries the history (user audio + codes, assistant text + codes).
    mic.say(np.concatenate([speech[1], silence(1.0)]))
    second = await client.wait_for("response.done", count=2)
    assert second["response"]["status"] in ("completed", "incomplete"), second
    history = pipeline.requests[1].history
    assert [h.role for h in history] == ["user", "assistant"]
    assert history[0].audio is not None and history[0].audio_tokens == user["audio_tokens"]
    assert history[1].text == text and history[1].audio_tokens == assistant["audio_tokens"]
    assert len((await store.get_conversation(conversation_id))["turns"]) == 4
    # The data channel speaks the GA shape, as OpenAI's WebRTC calls do: every event holds under
    # the SDK's models; the answer's playback is told as it started and, after its
    # response.done, as it ended.
    for event in client.events:
        check(event, "ga")
    rid = done["response"]["id"]
    kinds = [e["type"] for e in client.events if rid in (e.get("response_id"), e.get("response", {}).get("id"))]
    assert kinds.count("output_audio_buffer.started") == 1 and kinds[-1] == "output_audio_buffer.stopped", kinds
    assert kinds.index("response.done") < kinds.index("output_audio_buffer.stopped"), kinds
    await client.close()
    await kv_pool_full_again(pipeline)


async def test_barge_in_cancels_and_stores_truncated_interrupted_turn(server, speech):
    # A long answer (several seconds, played in real time): still playing when the user talks.
    http, pipeline = await server()
    mic = ScriptedMic()
    client = RtcClient(mic)
    await client.connect(http, session={"sampling": LONG_ANSWER})
    n = await long_answer_playing(client, pipeline, mic, speech[0], 3.0)
    answer_s = len(pipeline.handles[n - 1].done.audio_tokens) * SECONDS_PER_CODE
    # Talk over it once 5 codes (> 0.32 s) of it are stored as heard: played, whatever the load.
    conversation_id = client.of_type("input_audio_buffer.committed")[0]["conversation_id"]
    assert await heard_or_done(client, http, conversation_id, n, 5), "the answer (run to its limit) ended"
    mic.say(speech[1])  # talk over the assistant
    await client.wait_for("input_audio_buffer.speech_started", count=n + 1)
    client.send({"type": "session.update", "session": {"sampling": {"audio_top_k": 10, "max_new_tokens": 60}}})
    done = await client.wait_for("response.done", count=n)
    assert done["response"]["status"] == "cancelled"
    assert pipeline.cancelled == [pipeline.handles[n - 1].turn_id]
    cut = [
        e["type"] for e in client.of_type("output_audio_buffer.cleared") if e["response_id"] == done["response"]["id"]
    ]
    assert cut == ["output_audio_buffer.cleared"]  # the playback was cut where it was
    played_s = done["response"]["timings"]["played_s"]
    assert 0.32 < played_s < answer_s - 0.5
    turn = (await http.app[SERVER_CONTEXT].store.get_conversation(conversation_id))["turns"][2 * n - 1]
    assert turn["role"] == "assistant" and turn["interrupted"] is True
    assert turn["duration_s"] == pytest.approx(played_s, abs=0.05)
    # Truncated codes: those of the audio heard (80 ms each, the one cut into included).
    assert 0 < len(turn["audio_tokens"]) <= int(played_s / SECONDS_PER_CODE) + 2
    # The barge-in utterance becomes the next turn, with the interrupted turn in its history.
    after = await client.wait_for("response.done", count=n + 1)
    assert after["response"]["status"] in ("completed", "incomplete"), after
    history = pipeline.requests[n].history
    assert [h.role for h in history] == ["user", "assistant"] * n
    assert history[-1].audio_tokens == turn["audio_tokens"]
    assert pipeline.requests[n].sampling.max_new_tokens == 60
    await client.close()
    await kv_pool_full_again(pipeline)


async def test_response_cancel_and_session_update(server, speech):
    http, pipeline = await server()
    mic = ScriptedMic()
    client = RtcClient(mic)
    await client.connect(http, session={"vad": {"silence_ms": 300}})
    await client.wait_for("session.created")
    client.send(
        {
            "type": "session.update",
            "session": {"vad": {"threshold": 0.6}, "sampling": {"audio_temperature": 0.5, **LONG_ANSWER}},
        }
    )
    updated = await client.wait_for("session.updated")
    assert updated["session"]["vad"]["threshold"] == 0.6 and updated["session"]["vad"]["silence_ms"] == 300
    assert updated["session"]["sampling"]["audio_temperature"] == 0.5
    client.send({"type": "session.update", "session": {"vad": {"threshold": "high"}}})
    err = await client.wait_for("error")
    assert err["error"]["code"] == "invalid_value" and "vad.threshold" in err["error"]["message"]
    client.send({"type": "nope"})
    err = await client.wait_for("error", count=2)
    assert err["error"]["code"] == "unknown_event"
    client.send({"type": "conversation.select", "conversation_id": "does-not-exist"})
    err = await client.wait_for("error", count=3)
    assert err["error"]["code"] == "conversation_not_found"

    n = await long_answer_playing(client, pipeline, mic, speech[0], 2.0)
    client.send({"type": "response.cancel"})
    done = await client.wait_for("response.done", count=n)
    assert done["response"]["status"] == "cancelled" and pipeline.cancelled == [pipeline.handles[n - 1].turn_id]
    assert done["response"]["timings"]["played_s"] < len(pipeline.handles[n - 1].done.audio_tokens) * SECONDS_PER_CODE
    sampling = pipeline.requests[0].sampling
    assert sampling.audio_temperature == 0.5 and sampling.max_new_tokens == LONG_ANSWER["max_new_tokens"]
    conversation_id = client.of_type("input_audio_buffer.committed")[0]["conversation_id"]
    turn = (await http.app[SERVER_CONTEXT].store.get_conversation(conversation_id))["turns"][2 * n - 1]
    assert turn["interrupted"] and turn["duration_s"] == pytest.approx(
        done["response"]["timings"]["played_s"], abs=0.05
    )
    await client.close()
    await kv_pool_full_again(pipeline)


@pytest.mark.parametrize("how", ["select", "offer"])
async def test_continue_a_stored_conversation(server, speech, how):
    http, pipeline = await server()
    store = http.app[SERVER_CONTEXT].store
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
    done = await client.wait_for("response.done")
    assert done["response"]["status"] in ("completed", "incomplete"), done
    history = pipeline.requests[0].history
    assert [h.role for h in history] == ["user", "assistant"]
    assert history[0].audio is not None and history[0].audio_tokens == [3, 4]
    assert history[1].text == "Earlier answer." and history[1].audio_tokens == [5]
    turns = (await store.get_conversation(conv["id"]))["turns"]
    assert len(turns) == 4 and turns[3]["text"] == done["response"]["text"] and turns[3]["audio_tokens"]
    await client.close()
    await kv_pool_full_again(pipeline)


def vanish(client: RtcClient) -> None:
    """The client's machine drops off the network: its ICE sockets close without a word (no DTLS
    close, no RTCP BYE), so it answers none of the server's consent checks."""
    for transceiver in client.pc.getTransceivers():
        connection = transceiver.sender.transport.transport._connection  # (aiortc's ICE transport: aioice's)
        for protocol in connection._protocols:
            protocol.transport.close()


async def test_vanished_client_leaves_nothing_behind(server, speech, monkeypatch):
    # A long answer, still playing when the session notices the client is gone: by its ICE consent
    # checks failing (four in a row a tenth of a second apart here, RFC 7675's being seconds
    # apart; four, so that a loaded machine's slow answers to a live client's checks end nothing).
    monkeypatch.setattr(aioice.ice, "CONSENT_INTERVAL", 0.1)
    monkeypatch.setattr(aioice.ice, "CONSENT_FAILURES", 4)
    http, pipeline = await server()
    mic = ScriptedMic()
    client = RtcClient(mic)
    await client.connect(http, session={"sampling": LONG_ANSWER})
    n = await long_answer_playing(client, pipeline, mic, speech[0], 6.0)  # (outlasting the checks)
    mic.hang()  # the client stops sending anything, without a goodbye
    vanish(client)
    sessions = http.app[SERVER_CONTEXT].sessions

    async def closed():
        return not sessions

    await eventually(closed, "the session of a vanished client closed", interval=0.1)
    assert pipeline.cancelled == [pipeline.handles[n - 1].turn_id]
    await kv_pool_full_again(pipeline)
    # The answer was still in progress when the session closed (not completed before).
    assert [d["response"]["status"] for d in client.of_type("response.done")][n - 1 :] in ([], ["cancelled"])
    conversation_id = client.of_type("input_audio_buffer.committed")[0]["conversation_id"]
    turns = (await http.app[SERVER_CONTEXT].store.get_conversation(conversation_id))["turns"]
    assert [t["role"] for t in turns] == ["user", "assistant"] * n and turns[-1]["interrupted"]
    assert 0 < turns[-1]["duration_s"] < len(pipeline.handles[n - 1].done.audio_tokens) * SECONDS_PER_CODE
    await client.close()


async def test_a_microphone_muted_mid_utterance_ends_it_and_the_call_goes_on(server, speech, monkeypatch):
    """A client that stops sending audio on a live connection (a browser muting with
    replaceTrack(null)): what it did not send is heard as silence, so the utterance it cut is
    committed and answered, and the call stays up."""
    monkeypatch.setattr(microphone_in, "INPUT_TIMEOUT_S", 1.0)
    http, _ = await server()
    mic = ScriptedMic()
    client = RtcClient(mic)
    await client.connect(http)
    await client.wait_for("session.created")
    mic.say(np.concatenate([silence(0.3), speech[0]]))  # no silence after it: the mic stops there
    await client.wait_for("input_audio_buffer.speech_started")
    mic.hang()
    committed = await client.wait_for("input_audio_buffer.committed")
    done = await client.wait_for("response.done")
    assert done["response"]["status"] in ("completed", "incomplete"), done
    assert committed["item_id"] == client.of_type("input_audio_buffer.speech_stopped")[0]["item_id"]
    (session,) = http.app[SERVER_CONTEXT].sessions.live()  # the call is still up
    assert not session.closed
    await client.close()


async def test_an_event_larger_than_the_data_channel_takes_is_an_error(server, speech):
    """A retrieved spoken item carries its audio (about 64 KB of base64 a second at 24 kHz): past
    what the peer takes in one data channel message (aiortc's 256 KiB), the client gets an `error`
    naming the event and where the audio is, not silence; a small one still comes."""
    http, _ = await server()
    mic = ScriptedMic()
    client = RtcClient(mic)
    await client.connect(http, session={"vad": {"silence_ms": 2000}})  # one utterance over the gaps below
    await client.wait_for("session.created")
    mic.say(np.concatenate([silence(0.3), *[speech[0], silence(0.2)] * 3, silence(2.5)]))
    spoken = (await client.wait_for("input_audio_buffer.committed"))["item_id"]
    await client.wait_for("response.done")
    text = {"type": "input_text", "text": "Hello."}
    client.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [text]}})
    written = (await client.wait_for("conversation.item.added", count=3))["item"]["id"]
    client.send({"type": "conversation.item.retrieve", "item_id": spoken, "event_id": "retrieve_spoken"})
    error = (await client.wait_for("error"))["error"]
    assert error["code"] == "event_too_large" and "conversation.item.retrieved" in error["message"], error
    assert error["event_id"] == "retrieve_spoken", error
    committed = client.of_type("input_audio_buffer.committed")[0]
    path = f"/api/conversations/{committed['conversation_id']}/turns/{committed['item_index']}/audio"
    assert path in error["message"] and "{id}" not in error["message"], error
    assert (await (await http.get(path)).read())[:4] == b"RIFF"  # the turn's audio is there
    client.send({"type": "conversation.item.retrieve", "item_id": written})
    assert (await client.wait_for("conversation.item.retrieved"))["item"]["id"] == written
    assert len(client.of_type("input_audio_buffer.committed")) == 1
    await client.close()


def test_too_large_names_the_audio_path_only_once_it_is_there():
    """The audio of an answer in progress is joined into its turn's WAV when it ends: until then
    the error says so, instead of naming a path that answers 404."""
    event = {"type": "conversation.item.retrieved", "conversation_id": "c1", "client_event_id": "ev"}
    item = {"has_audio": True, "index": 1}
    path = "GET /api/conversations/c1/turns/1/audio"
    stored = too_large_error(event | {"item": item | {"status": "incomplete"}}, 300_000, "limit")["error"]
    playing = too_large_error(event | {"item": item | {"status": "in_progress"}}, 300_000, "limit")["error"]
    assert stored["message"].endswith(f"its audio is at {path}") and stored["event_id"] == "ev"
    assert playing["message"].endswith(f"in progress: its audio will be at {path} once it has ended")
