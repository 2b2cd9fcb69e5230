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

from helpers.audio import silence
from helpers.realtime_events import MODEL, Events, conversation, say

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow

SECONDS_PER_CODE = 0.08


async def speak(conn, pcm16k: np.ndarray, spoken: list[float]) -> None:
    """say() an utterance and 1 s of silence (server VAD ends the turn), noting when it began."""
    spoken.append(time.monotonic())
    await say(conn, np.concatenate([pcm16k, silence(1.0)]))


async def test_two_turns_with_server_vad_barge_in_and_truncate(v1_server, speech, openai_client):
    async with openai_client.beta.realtime.connect(model=MODEL) as conn:
        events = Events(conn)
        created = await events.wait_for("session.created")
        assert created.session.turn_detection.type == "server_vad"
        await conn.session.update(
            session={
                "instructions": "Answer briefly.",
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 400, "threshold": 0.5},
            }
        )
        updated = await events.wait_for("session.updated")
        assert (
            updated.session.instructions == "Answer briefly."
            and updated.session.turn_detection.silence_duration_ms == 400
        )

        # Turn 1: server VAD hears the end of the utterance and answers.
        spoken = [time.monotonic()]  # when each utterance began to be sent (answer n follows spoken[n - 1])
        await say(conn, np.concatenate([silence(0.3), speech[0], silence(1.0)]))
        committed = await events.wait_for("input_audio_buffer.committed")
        assert committed.item_id == events.of_type("input_audio_buffer.speech_stopped")[0].item_id
        done = await events.wait_for("response.done")
        assert done.response.status == "completed", done
        first_id = done.response.id
        transcript = "".join(e.delta for e in events.of_type("response.audio_transcript.delta"))
        assert transcript == done.response.text
        pcm = np.frombuffer(b"".join(base64.b64decode(e.delta) for e in events.of_type("response.audio.delta")), "<i2")
        assert pcm.size > 0 and np.abs(pcm).max() > 300  # the demo's noise speech, not silence
        conversation_id = committed.model_extra["conversation_id"]

        # Turn 2: long answers; the user talks over one once the client has received 1 s of it
        # and 0.5 s more has passed. Whether the CPU generates faster or slower than real time,
        # the server's clock (played = min(sent, elapsed since the first delta)) then reads
        # > 0.5 s. Every utterance is answered once (interrupted or not), so answer n is the
        # n-th response.created; one that ends before the barge-in lands is retried.
        await conn.session.update(session={"max_response_output_tokens": 400, "sampling": {"audio_top_k": 1}})
        await events.wait_for("session.updated", count=2)
        await speak(conn, speech[1], spoken)
        for _ in range(8):
            rid = (await events.wait_for("response.created", count=len(spoken))).response.id
            await events.until(lambda: events.audio_seconds(rid) >= 1.0 or events.done(rid))
            if events.done(rid):  # too short: ask again
                await speak(conn, speech[1], spoken)
                continue
            await asyncio.sleep(0.5)
            barge_at = len(events.items)
            await speak(conn, speech[0], spoken)  # barge in
            cut = await events.until(lambda: events.done(rid))
            if cut.response.status == "cancelled":
                break
            # It finished playing before the VAD heard the user: the barge-in is the next question.
        else:
            raise AssertionError(
                "no answer was still playing at a barge-in in 8 attempts: "
                + str(
                    [(d.response.status, events.audio_seconds(d.response.id)) for d in events.of_type("response.done")]
                )
            )
        assert cut.response.status_details.reason == "turn_detected"
        played_s = cut.response.model_extra["timings"]["played_s"]
        # The server stops sending at speech_started, so the client had received all it counts
        # as played; and its clock started after this answer's question was sent.
        started = next(
            i for i in range(barge_at, len(events.items)) if events.items[i].type == "input_audio_buffer.speech_started"
        )
        received_s = (
            sum(
                len(base64.b64decode(e.delta)) // 2
                for e in events.items[:started]
                if e.type == "response.audio.delta" and e.response_id == rid
            )
            / 24000
        )
        assert 0.4 < played_s <= received_s + 0.01, (played_s, received_s)
        assert played_s <= events.arrived[started] - spoken[-2] + 0.01
        assert not [e for e in events.items[started:] if e.type == "response.audio.delta" and e.response_id == rid]
        after = await events.wait_for("response.done", count=len(spoken))
        assert after.response.id != rid and after.response.status == "completed", after

        # The client says it played less than the server's clock estimated: the store follows.
        item_id = cut.response.output[0].id
        await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=300)
        truncated = await events.wait_for("conversation.item.truncated")
        assert truncated.item_id == item_id and truncated.audio_end_ms == 300
        cut_index = [e.response.id for e in events.of_type("response.created")].index(rid)

    turns = (await conversation(v1_server, conversation_id))["turns"]
    assert [t["role"] for t in turns] == ["user", "assistant"] * len(spoken)
    assert [t["interrupted"] for t in turns[1::2]] == [i == cut_index for i in range(len(spoken))]
    assert turns[1]["text"] == transcript
    assert turns[1]["duration_s"] == pytest.approx(pcm.size / 24000, abs=0.01)
    cut_turn = turns[2 * cut_index + 1]
    assert cut_turn["duration_s"] == pytest.approx(0.3, abs=0.01)
    # The codes of the audio heard (none if the loaded machine's pipeline took longer than the
    # session's grace to confirm the cancel: then the answer's codes are unknown).
    assert len(cut_turn["audio_tokens"] or []) <= int(0.3 / SECONDS_PER_CODE) + 1, cut_turn
    assert first_id != rid


async def test_manual_commit_text_items_and_errors(v1_server, speech, openai_client):
    async with openai_client.beta.realtime.connect(model=MODEL) as conn:
        events = Events(conn)
        await events.wait_for("session.created")
        await conn.session.update(
            session={"turn_detection": None, "modalities": ["text"], "input_audio_format": "pcm16"}
        )
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

        # Absences proven by order, not by waiting: the socket handles a client's events one at
        # a time, in order (a VAD's commit is queued while its audio is handled), and the
        # session takes committed turns, text items and response.create from one queue, in
        # order, a turn's answer started (response.created sent) before the next is taken. The
        # speech ends in more silence than the server's VAD needs to end a turn ([vad] silence_ms).
        await say(conn, np.concatenate([speech[0], silence(0.8)]))
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there."}]}
        )
        text_item = await events.wait_for("conversation.item.created")
        assert text_item.item.role == "user" and text_item.item.content[0].text == "Hello there."
        assert not events.of_type("input_audio_buffer.committed")  # no VAD: nothing happens by itself
        await conn.input_audio_buffer.commit()
        committed = await events.wait_for("input_audio_buffer.committed")
        assert committed.previous_item_id == text_item.item.id
        await conn.response.create()
        done = await events.wait_for("response.done")
        assert done.response.status == "completed", done
        assert "".join(e.delta for e in events.of_type("response.text.delta")) == done.response.text
        assert not events.of_type("response.audio.delta")  # text only
        await conn.response.create()  # the conversation now ends with an answer: nothing to answer
        assert (await events.wait_for("error", count=4)).error.code == "no_user_audio"
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Bye."}]}
        )
        await events.until(
            lambda: [
                e
                for e in events.of_type("conversation.item.created")
                if getattr(e.item.content[0], "text", None) == "Bye."
            ]
        )
        # A manual commit does not answer by itself: had it, that answer would have come first
        # and the response.create asked for would have found nothing to answer.
        assert len(events.of_type("response.created")) == 1 and len(events.of_type("error")) == 4, [
            e.type for e in events.items
        ]


async def test_response_create_while_one_runs_and_early_cancels(v1_server, speech, openai_client):
    """A second response.create is refused while a response runs (the running one is not lost); a
    response.cancel right after response.create cancels it though it had not started; one with
    nothing to cancel is an error, as OpenAI answers each."""
    async with openai_client.beta.realtime.connect(model=MODEL) as conn:
        events = Events(conn)
        await events.wait_for("session.created")
        await conn.session.update(session={"turn_detection": None, "modalities": ["text"]})
        await events.wait_for("session.updated")
        await conn.send({"type": "output_audio_buffer.clear"})  # "stop what plays": nothing does, no error
        await conn.response.cancel()
        assert (await events.wait_for("error")).error.code == "response_cancel_not_active"
        await conn.session.update(session={"modalities": ["text"]})
        await events.wait_for("session.updated", count=2)  # events are handled in order: any error came before
        assert len(events.of_type("error")) == 1, [e.error for e in events.of_type("error")]

        await say(conn, speech[0])
        await conn.input_audio_buffer.commit()
        await conn.response.create(response={"max_output_tokens": 20})
        await conn.response.create(response={"max_output_tokens": 20})
        refused = await events.wait_for("error", count=2)
        assert refused.error.code == "conversation_already_has_active_response", refused
        first = await events.wait_for("response.done")
        assert first.response.status == "completed" and len(events.of_type("response.created")) == 1

        await say(conn, speech[1])
        await conn.input_audio_buffer.commit()
        await conn.response.create(response={"max_output_tokens": 20})
        await conn.response.cancel()  # before the turn task took the response.create
        second = await events.wait_for("response.done", count=2)
        assert second.response.status == "cancelled" and second.response.status_details.reason == "client_cancelled"
        assert len(events.of_type("error")) == 2, [e.error for e in events.of_type("error")]

        await say(conn, speech[0])
        await conn.input_audio_buffer.commit()
        await conn.response.create(response={"instructions": "hello world " * 5000})  # past engine.max_model_len
        failed = await events.wait_for("response.done", count=3)
        assert failed.response.status == "failed", failed
        assert failed.response.status_details.error.code == "context_length_exceeded", failed.response.status_details


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
