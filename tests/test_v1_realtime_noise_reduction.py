"""OpenAI's `audio.input.noise_reduction` (beta: `input_audio_noise_reduction`) with the official
`openai` client against a real server on the demo checkpoint: session.updated reports it; the
audio a session commits is what audio/noise_reduction.py makes of what was appended, all of it
(what the reducer still held at the commit included), in either shape; the VAD still hears
the noisy speech through it; a kind OpenAI does not have is an `error` naming the field."""

import base64

import numpy as np
import pytest

from kimiaudio.audio import pcm16
from kimiaudio.audio.noise_reduction import NoiseReduction

from helpers.realtime_sessions import APIS, connect, open_session, session_update

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow

RATE = 16000  # kimiaudio's 16 kHz pcm16 input: the session keeps the samples it is sent
SAME_PCM16 = 3  # int16 steps between audio sent and read back (16-bit storage rounds twice)
# The reducer's samples fall between int16 steps: stored and read back, they move by up to about
# 2e-4 of full scale (measured: 5 steps at the loudest).
REDUCED_PCM16 = 8


def with_noise(speech: np.ndarray, seed: int = 0) -> np.ndarray:
    """Half a second of noise alone, then the speech with the noise under it at about 10 dB."""
    x = np.concatenate([np.zeros(RATE // 2, np.float32), speech.astype(np.float32)])
    noise = np.random.default_rng(seed).standard_normal(x.size).astype(np.float32)
    return x + noise * 0.3 * np.sqrt(np.mean(speech**2))


def reduction(api: str, kind: str | None) -> dict:
    value = None if kind is None else {"type": kind}
    if api == "ga":
        return {"audio": {"input": {"noise_reduction": value, "format": {"type": "audio/pcm", "rate": RATE}}}}
    return {"input_audio_noise_reduction": value, "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}}}}


def reported(session, api: str):
    value = session.audio.input.noise_reduction if api == "ga" else session.input_audio_noise_reduction
    return None if value is None else value.type


async def append(conn, pcm: np.ndarray, step: int = 1600) -> None:
    data = pcm16.to_bytes(pcm)
    for start in range(0, len(data), 2 * step):
        await conn.input_audio_buffer.append(audio=base64.b64encode(data[start : start + 2 * step]).decode())


def samples(b64: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype="<i2").astype(np.int32)


@pytest.mark.parametrize("api", APIS)
async def test_a_committed_turn_is_the_appended_audio_with_its_noise_turned_down(v1_server, speech, openai_client, api):
    sent = pcm16.to_float(pcm16.to_bytes(with_noise(speech[0])))  # (as the server decodes it)
    async with connect(openai_client, api) as conn:
        events = await open_session(conn, api, turn_detection=None)
        await conn.session.update(session=session_update(api, turn_detection=None) | reduction(api, "far_field"))
        assert reported((await events.wait_for("session.updated", count=2)).session, api) == "far_field"
        await append(conn, sent)
        await conn.input_audio_buffer.commit()
        item_id = (await events.wait_for("input_audio_buffer.committed")).item_id
        await conn.send({"type": "conversation.item.retrieve", "item_id": item_id})
        taken = samples((await events.wait_for("conversation.item.retrieved")).item.content[0].audio)

        await conn.session.update(session=session_update(api, turn_detection=None) | reduction(api, None))
        assert reported((await events.wait_for("session.updated", count=3)).session, api) is None
        await append(conn, sent)
        await conn.input_audio_buffer.commit()
        item_id = (await events.wait_for("input_audio_buffer.committed", count=2)).item_id
        await conn.send({"type": "conversation.item.retrieve", "item_id": item_id})
        plain = samples((await events.wait_for("conversation.item.retrieved", count=2)).item.content[0].audio)

    reducer = NoiseReduction("far_field")
    expected = np.concatenate([reducer.push(sent), reducer.flush()])
    expected = np.frombuffer(pcm16.to_bytes(expected), dtype="<i2").astype(np.int32)
    assert taken.size == expected.size == sent.size and np.max(np.abs(taken - expected)) <= REDUCED_PCM16
    as_sent = np.frombuffer(pcm16.to_bytes(sent), dtype="<i2").astype(np.int32)
    assert plain.size == as_sent.size and np.max(np.abs(plain - as_sent)) <= SAME_PCM16  # (off again)
    noise_alone = slice(RATE // 10, RATE // 2)
    assert np.std(taken[noise_alone]) < np.std(as_sent[noise_alone]) / 3  # (at least 10 dB down)


async def test_the_vad_hears_noisy_speech_through_the_reducer(v1_server, speech, openai_client):
    async with connect(openai_client, "ga") as conn:
        events = await open_session(conn, "ga")
        session = session_update("ga", transcription=None) | reduction("ga", "near_field")
        session["audio"]["input"]["turn_detection"] = {"type": "server_vad", "create_response": False}
        await conn.session.update(session=session)
        assert reported((await events.wait_for("session.updated", count=2)).session, "ga") == "near_field"
        await append(conn, np.concatenate([with_noise(speech[0]), np.zeros(RATE, np.float32)]))
        started = await events.wait_for("input_audio_buffer.speech_started")
        stopped = await events.wait_for("input_audio_buffer.speech_stopped")
        assert 300 <= started.audio_start_ms < stopped.audio_end_ms  # (the speech begins at 500 ms)
        assert (await events.wait_for("input_audio_buffer.committed")).item_id == stopped.item_id


@pytest.mark.parametrize("api", APIS)
async def test_a_kind_openai_has_not_is_refused_naming_the_field(v1_server, openai_client, api):
    async with connect(openai_client, api) as conn:
        events = await open_session(conn, api)
        bad = reduction(api, "studio")
        await conn.send({"type": "session.update", "session": bad, "event_id": "ev_studio"})
        error = (await events.wait_for("error")).error
        field = "audio.input.noise_reduction" if api == "ga" else "input_audio_noise_reduction"
        assert (error.param, error.event_id) == (f"session.{field}.type", "ev_studio")
        assert "'near_field' or 'far_field'" in error.message
