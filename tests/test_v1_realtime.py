"""GET /v1/realtime with the official `openai` client (its Realtime connection, unchanged)
against a real `serve` process on the demo checkpoint: a conversation with server VAD, a
barge-in, conversation.item.truncate, manual commits, and error events for bad input. The
demo weights answer with noise, so the checks are about what was generated, streamed and
stored, not about words."""

import asyncio
import base64
import json
import time

import aiohttp
import numpy as np
import pytest

from kimiaudio.audio.io import resample
from kimiaudio.audio import pcm16
from test_server_support import silence

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow

MODEL = "kimi-audio-7b-instruct"
SECONDS_PER_CODE = 0.08


class Events:
    """Reads a Realtime connection in the background; the events as the client parsed them."""

    def __init__(self, conn):
        self.conn = conn
        self.items: list = []
        self.arrived: list[float] = []  # time.monotonic() of each event's arrival
        self.task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self):
        async for event in self.conn:
            self.items.append(event)
            self.arrived.append(time.monotonic())

    def of_type(self, kind: str) -> list:
        return [e for e in self.items if e.type == kind]

    async def wait_for(self, kind: str, count: int = 1, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while len(self.of_type(kind)) < count:
            if time.monotonic() > deadline or self.task.done():
                raise AssertionError(f"no {kind} (x{count}) in {timeout} s: {[e.type for e in self.items]}")
            await asyncio.sleep(0.02)
        return self.of_type(kind)[count - 1]

    def first_arrival(self, kind: str, **fields) -> float | None:
        return next((t for e, t in zip(self.items, self.arrived)
                     if e.type == kind and all(getattr(e, k) == v for k, v in fields.items())), None)

    def audio_seconds(self, response_id: str) -> float:
        return sum(len(base64.b64decode(e.delta)) // 2 for e in self.of_type("response.audio.delta")
                   if e.response_id == response_id) / 24000


async def say(conn, pcm16k: np.ndarray, chunk_s: float = 0.1) -> None:
    """Append 16 kHz speech as OpenAI's pcm16 (24 kHz), in 100 ms messages."""
    pcm = pcm16.to_bytes(resample(pcm16k, 16000, 24000))
    step = int(chunk_s * 24000) * 2
    for start in range(0, len(pcm), step):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[start:start + step]).decode())
        await asyncio.sleep(0.005)


async def conversation(base_url: str, conversation_id: str) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base_url}/api/conversations/{conversation_id}") as resp:
            return await resp.json()


async def test_two_turns_with_server_vad_barge_in_and_truncate(v1_server, speech, openai_client):
    async with openai_client.beta.realtime.connect(model=MODEL) as conn:
        events = Events(conn)
        created = await events.wait_for("session.created")
        assert created.session.turn_detection.type == "server_vad"
        await conn.session.update(session={"instructions": "Answer briefly.", "turn_detection": {
            "type": "server_vad", "silence_duration_ms": 400, "threshold": 0.5}})
        updated = await events.wait_for("session.updated")
        assert updated.session.instructions == "Answer briefly." and updated.session.turn_detection.silence_duration_ms == 400

        # Turn 1: server VAD hears the end of the utterance and answers.
        await say(conn, np.concatenate([silence(0.3), speech[0], silence(1.0)]))
        committed = await events.wait_for("input_audio_buffer.committed")
        assert committed.item_id == events.of_type("input_audio_buffer.speech_stopped")[0].item_id
        done = await events.wait_for("response.done", timeout=60)
        assert done.response.status == "completed", done
        first_id = done.response.id
        transcript = "".join(e.delta for e in events.of_type("response.audio_transcript.delta"))
        assert transcript == done.response.text
        pcm = np.frombuffer(b"".join(base64.b64decode(e.delta) for e in events.of_type("response.audio.delta")), "<i2")
        assert pcm.size > 0 and np.abs(pcm).max() > 300  # the demo's noise speech, not silence
        conversation_id = committed.model_extra["conversation_id"]

        # Turn 2: long answers, so one is still playing when the user talks over it.
        await conn.session.update(session={"max_response_output_tokens": 400, "sampling": {"audio_top_k": 1}})
        await events.wait_for("session.updated", count=2)
        for attempt in range(1, 7):
            await say(conn, np.concatenate([speech[1], silence(1.0)]))
            created = await events.wait_for("response.created", count=1 + attempt)
            rid = created.response.id
            deadline = time.monotonic() + 30
            while events.audio_seconds(rid) < 2.0 and not [d for d in events.of_type("response.done")
                                                          if d.response.id == rid]:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            # Generated faster than played: most of it is still to be heard (the server's clock
            # counts from the first delta). Otherwise let it finish and speak again.
            first_delta = events.first_arrival("response.audio.delta", response_id=rid)
            if events.audio_seconds(rid) >= 2.0 and time.monotonic() - first_delta < events.audio_seconds(rid) - 1.2:
                break
            await events.wait_for("response.done", count=1 + attempt)
        else:
            raise AssertionError("no answer of 2 s still playing in 6 attempts: " + str(
                [(d.response.status, events.audio_seconds(d.response.id)) for d in events.of_type("response.done")]))
        await asyncio.sleep(0.5)
        await say(conn, np.concatenate([speech[0], silence(1.0)]))  # barge in
        cut = await events.wait_for("response.done", count=1 + attempt)
        assert cut.response.id == rid and cut.response.status == "cancelled"
        assert cut.response.status_details.reason == "turn_detected"
        played_s = cut.response.model_extra["timings"]["played_s"]
        started = [t for e, t in zip(events.items, events.arrived) if e.type == "input_audio_buffer.speech_started"][-1]
        assert played_s == pytest.approx(started - first_delta, abs=0.3)  # the real-time clock's estimate
        assert 0.4 < played_s < events.audio_seconds(rid) - 0.3
        after = await events.wait_for("response.done", count=2 + attempt, timeout=60)
        assert after.response.status == "completed"

        # The client says it played less than the server's clock estimated: the store follows.
        item_id = cut.response.output[0].id
        await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=300)
        truncated = await events.wait_for("conversation.item.truncated")
        assert truncated.item_id == item_id and truncated.audio_end_ms == 300

    turns = (await conversation(v1_server, conversation_id))["turns"]
    assert [t["role"] for t in turns] == ["user", "assistant"] * (2 + attempt)
    assert turns[1]["text"] == transcript and not turns[1]["interrupted"]
    assert turns[1]["duration_s"] == pytest.approx(pcm.size / 24000, abs=0.01)
    cut_turn = turns[2 * attempt + 1]
    assert cut_turn["interrupted"] and cut_turn["duration_s"] == pytest.approx(0.3, abs=0.01)
    # The codes of the audio heard (none if the loaded machine's pipeline took longer than the
    # session's grace to confirm the cancel: then the answer's codes are unknown).
    assert len(cut_turn["audio_tokens"] or []) <= int(0.3 / SECONDS_PER_CODE) + 1, cut_turn
    assert first_id != rid


async def test_manual_commit_text_items_and_errors(v1_server, speech, openai_client):
    async with openai_client.beta.realtime.connect(model=MODEL) as conn:
        events = Events(conn)
        await events.wait_for("session.created")
        await conn.session.update(session={"turn_detection": None, "modalities": ["text"],
                                           "input_audio_format": "pcm16"})
        updated = await events.wait_for("session.updated")
        assert updated.session.turn_detection is None and updated.session.modalities == ["text"]

        await conn.send({"type": "input_audio_buffer.commit"})  # nothing appended yet
        assert (await events.wait_for("error")).error.code == "input_audio_buffer_commit_empty"
        await conn.send({"type": "input_audio_buffer.append", "audio": "%%%"})
        bad = await events.wait_for("error", count=2)
        assert bad.error.code == "invalid_audio" and "base64" in bad.error.message
        await conn.session.update(session={"input_audio_format": "g711_ulaw"})
        bad = await events.wait_for("error", count=3)
        assert bad.error.code == "unsupported_format" and bad.error.param == "session.input_audio_format"

        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Hello there."}]})
        text_item = await events.wait_for("conversation.item.created")
        assert text_item.item.role == "user" and text_item.item.content[0].text == "Hello there."
        await say(conn, np.concatenate([speech[0], silence(0.3)]))
        await asyncio.sleep(0.5)
        assert not events.of_type("input_audio_buffer.committed")  # no VAD: nothing happens by itself
        await conn.input_audio_buffer.commit()
        committed = await events.wait_for("input_audio_buffer.committed")
        assert committed.previous_item_id == text_item.item.id
        await asyncio.sleep(0.3)
        assert not events.of_type("response.created")  # a manual commit does not answer by itself
        await conn.response.create()
        done = await events.wait_for("response.done", timeout=60)
        assert done.response.status == "completed", done
        assert "".join(e.delta for e in events.of_type("response.text.delta")) == done.response.text
        assert not events.of_type("response.audio.delta")  # text only
        await conn.response.create()  # the conversation now ends with an answer: nothing to answer
        assert (await events.wait_for("error", count=4)).error.code == "no_user_audio"


async def test_wrong_model_and_plain_http_are_refused(v1_server):
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{v1_server}/v1/realtime?model=gpt-4-turbo") as resp:
            body = await resp.json()
            assert resp.status == 404 and body["error"]["code"] == "model_not_found"
        async with http.get(f"{v1_server}/v1/realtime") as resp:
            assert resp.status == 400 and (await resp.json())["error"]["code"] == "websocket_expected"
        async with http.ws_connect(f"{v1_server}/v1/realtime") as ws:
            assert json.loads((await ws.receive()).data)["type"] == "session.created"
            await ws.send_bytes(b"\x00\x01")
            await ws.send_str("{" * 5000)
            errors = [json.loads((await ws.receive()).data) for _ in range(2)]
            assert [e["error"]["code"] for e in errors] == ["invalid_event", "invalid_json"], errors
