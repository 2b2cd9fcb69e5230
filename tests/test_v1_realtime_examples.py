"""The official `openai` SDK's own Realtime examples against a real `serve` (demo checkpoint),
each in both shapes, with the calls and the event handling the examples use, every event
checked against the SDK's models of its shape:

- examples/realtime/realtime.py and the README snippet: a text session (`gpt-realtime-2`), a
  user text message, response.create, read until response.done: the text message is answered,
  its text deltas making the response's text.
- examples/realtime/push_to_talk_app.py: server VAD, one response.cancel as the first audio
  goes out, the microphone as 20 ms chunks of 24 kHz pcm16, the answer's audio and transcript
  deltas keyed by item_id; and its manual mode (audio_util.py): commit, then
  response.create with an empty response.
"""

import asyncio
import base64
import json

import numpy as np
import pytest

from kimiaudio.audio import pcm16
from kimiaudio.audio.resampling import resample

from helpers.audio import silence
from helpers.openai_strict import check, named
from helpers.realtime_sessions import APIS, connect, session_update

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow

HANG_S = 300.0  # only ends a hung example: a loaded machine's demo model is slow, never this slow
MODELS = {"ga": "gpt-realtime-2", "beta": "gpt-4o-realtime-preview"}  # the examples' own names


async def events_of(connection, api: str):
    """The connection's events as the SDK parses them (`async for event in connection`), each
    checked strictly first."""
    while True:
        data = await connection.recv_bytes()
        check(json.loads(data), api)
        yield connection.parse_event(data)


@pytest.mark.parametrize("api", APIS)
async def test_the_text_example_ends_with_response_done(v1_server, openai_client, api):
    async def example() -> tuple[str, object]:
        text = ""
        async with connect(openai_client, api, model=MODELS[api]) as connection:
            if api == "ga":
                session = {"output_modalities": ["text"], "model": "gpt-realtime", "type": "realtime"}
            else:
                session = {"modalities": ["text"]}
            await connection.session.update(session=session)
            await connection.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello!"}]}
            )
            await connection.response.create()
            async for event in events_of(connection, api):
                if event.type == named("response.output_text.delta", api):
                    text += event.delta
                elif event.type == "response.done":
                    return text, event
        raise AssertionError("the connection ended before response.done")

    text, done = await asyncio.wait_for(example(), HANG_S)
    assert done.response.status in ("completed", "incomplete"), done
    assert done.response.output[0].content[0].text == text  # the demo's greedy text may be empty


def microphone(speech: np.ndarray) -> list[str]:
    """Speech then 1 s of silence as the push-to-talk app sends it: 20 ms of 24 kHz pcm16 each."""
    pcm = pcm16.to_bytes(resample(np.concatenate([silence(0.3), speech, silence(1.0)]), 16000, 24000))
    return [base64.b64encode(pcm[i : i + 960]).decode() for i in range(0, len(pcm), 960)]


@pytest.mark.parametrize("manual", [False, True], ids=["server_vad", "manual"])
@pytest.mark.parametrize("api", APIS)
async def test_the_push_to_talk_example(v1_server, speech, openai_client, api, manual):
    async def example():
        async with connect(openai_client, api, model=MODELS[api]) as connection:
            detection = None if manual else {"type": "server_vad"}
            session = session_update(api, turn_detection=detection)
            if api == "ga":
                session["model"] = "gpt-realtime"
            await connection.session.update(session=session)
            audio, transcripts, sent_audio, session_id = {}, {}, False, None
            chunks = microphone(speech[0])

            async def send_microphone():
                nonlocal sent_audio
                for chunk in chunks:
                    if not sent_audio:  # the app's: cancel whatever answer plays as the user starts
                        await connection.send({"type": "response.cancel"})
                        sent_audio = True
                    await connection.input_audio_buffer.append(audio=chunk)
                    await asyncio.sleep(0.002)
                if manual:  # key released (audio_util.py's manual mode)
                    await connection.input_audio_buffer.commit()
                    await connection.send({"type": "response.create", "response": {}})

            sender = asyncio.get_running_loop().create_task(send_microphone())
            try:
                async for event in events_of(connection, api):
                    if event.type == "session.created":
                        session_id = event.session.id
                        assert session_id
                    elif event.type == named("response.output_audio.delta", api):
                        audio[event.item_id] = audio.get(event.item_id, b"") + base64.b64decode(event.delta)
                    elif event.type == named("response.output_audio_transcript.delta", api):
                        transcripts[event.item_id] = transcripts.get(event.item_id, "") + event.delta
                    elif event.type == "response.done" and event.response.status != "failed":
                        return session_id, audio, transcripts, event
            finally:
                await sender
        raise AssertionError("the connection ended before response.done")

    session_id, audio, transcripts, done = await asyncio.wait_for(example(), HANG_S)
    assert session_id.startswith("sess_") and done.response.status in ("completed", "incomplete"), done
    (item,) = done.response.output
    assert set(audio) == {item.id} and len(audio[item.id]) > 0
    assert transcripts.get(item.id, "") == item.content[0].transcript == done.response.model_extra["text"]
