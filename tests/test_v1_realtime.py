"""GET /v1/realtime with the official `openai` client (its Realtime connection, unchanged)
against a real `serve` process on the demo checkpoint, as a GA client (`client.realtime.connect()`)
and as a beta one (`client.beta.realtime.connect()`), every event checked against the SDK's
models of its shape (helpers/realtime_events.py): a conversation with server VAD, a barge-in,
conversation.item.truncate, manual commits, and error events for bad input; which shape a
connection speaks, and the subprotocol a browser is answered with. The demo weights answer
with noise, so the checks are about what was generated, streamed and stored, not about words."""

import asyncio
import base64
import json
import time

import aiohttp
import numpy as np
import pytest

from helpers.audio import silence
from helpers.openai_strict import check, named
from helpers.realtime_events import Events, conversation, say
from helpers.realtime_sessions import APIS, connect, session_update, text_only, turn_detection

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow

SECONDS_PER_CODE = 0.08


async def speak(conn, pcm16k: np.ndarray, spoken: list[float]) -> None:
    """say() an utterance and 1 s of silence (server VAD ends the turn), noting when it began."""
    spoken.append(time.monotonic())
    await say(conn, np.concatenate([pcm16k, silence(1.0)]))


# A response's events other than deltas, in order (GA names; a beta connection has no
# conversation.item.done and names the rest its way).
RESPONSE_EVENTS = (
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
)


def response_events(events: Events, response_id: str, item_id: str) -> list[str]:
    """The types of the events of one response (and its item), deltas left out."""
    return [
        e.type
        for e in events.items
        if not e.type.endswith(".delta")
        and (
            getattr(e, "response_id", None) == response_id
            or getattr(getattr(e, "response", None), "id", None) == response_id
            or getattr(getattr(e, "item", None), "id", None) == item_id
        )
    ]


@pytest.mark.parametrize("api", APIS)
async def test_two_turns_with_server_vad_barge_in_and_truncate(v1_server, speech, openai_client, api):
    async with connect(openai_client, api) as conn:
        events = Events(conn, api)
        created = await events.wait_for("session.created")
        assert turn_detection(created.session, api).type == "server_vad" and created.session.id.startswith("sess_")
        await conn.session.update(
            session=session_update(
                api,
                instructions="Answer briefly.",
                turn_detection={"type": "server_vad", "silence_duration_ms": 400, "threshold": 0.5},
            )
        )
        updated = await events.wait_for("session.updated")
        assert updated.session.instructions == "Answer briefly."
        assert turn_detection(updated.session, api).silence_duration_ms == 400

        # Turn 1: server VAD hears the end of the utterance and answers.
        spoken = [time.monotonic()]  # when each utterance began to be sent (answer n follows spoken[n - 1])
        await say(conn, np.concatenate([silence(0.3), speech[0], silence(1.0)]))
        committed = await events.wait_for("input_audio_buffer.committed")
        assert committed.item_id == events.of_type("input_audio_buffer.speech_stopped")[0].item_id
        done = await events.wait_for("response.done")
        assert done.response.status in ("completed", "incomplete"), done
        first_id = done.response.id
        transcript = "".join(e.delta for e in events.of_type("response.output_audio_transcript.delta"))
        assert transcript == done.response.text
        deltas = events.of_type("response.output_audio.delta")
        pcm = np.frombuffer(b"".join(base64.b64decode(e.delta) for e in deltas), "<i2")
        assert pcm.size > 0 and np.abs(pcm).max() > 300  # the demo's noise speech, not silence
        item = done.response.output[0]
        assert {e.item_id for e in deltas} == {item.id} and item.content[0].transcript == transcript
        expected = [named(kind, api) for kind in RESPONSE_EVENTS if api == "ga" or kind != "conversation.item.done"]
        assert response_events(events, first_id, item.id) == expected
        assert not events.of_type("output_audio_buffer.started")  # WebRTC only: a WebSocket client plays the deltas
        conversation_id = committed.model_extra["conversation_id"]

        # Turn 2: long answers; the user talks over one once the client has received 1 s of it
        # and 0.5 s more has passed. Whether the CPU generates faster or slower than real time,
        # the server's clock (played = min(sent, elapsed since the first delta)) then reads
        # > 0.5 s. Every utterance is answered once (interrupted or not), so answer n is the
        # n-th response.created; one that ends before the barge-in lands is retried.
        # The answer to the barge-in is kept short: a session.update applies to the responses
        # created after it, the one playing keeps its limit.
        limit = "max_output_tokens" if api == "ga" else "max_response_output_tokens"

        async def answers_up_to(tokens: int) -> None:
            updates = len(events.of_type("session.updated")) + 1
            await conn.session.update(session=session_update(api, sampling={"audio_top_k": 1}, **{limit: tokens}))
            await events.wait_for("session.updated", count=updates)

        await answers_up_to(400)
        await speak(conn, speech[1], spoken)
        for _ in range(8):
            rid = (await events.wait_for("response.created", count=len(spoken))).response.id
            await events.until(lambda: events.audio_seconds(rid) >= 1.0 or events.done(rid))
            if events.done(rid):  # too short: ask again
                await answers_up_to(400)
                await speak(conn, speech[1], spoken)
                continue
            await asyncio.sleep(0.5)
            await answers_up_to(24)
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
                if e.type == named("response.output_audio.delta", api) and e.response_id == rid
            )
            / 24000
        )
        assert 0.4 < played_s <= received_s + 0.01, (played_s, received_s)
        assert played_s <= events.arrived[started] - spoken[-2] + 0.01
        after_cut = events.items[started:]
        assert not [
            e for e in after_cut if e.type == named("response.output_audio.delta", api) and e.response_id == rid
        ]
        after = await events.wait_for("response.done", count=len(spoken))
        assert after.response.id != rid and after.response.status in ("completed", "incomplete"), after

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


@pytest.mark.parametrize("api", APIS)
async def test_manual_commit_text_items_and_errors(v1_server, speech, openai_client, api):
    async with connect(openai_client, api) as conn:
        events = Events(conn, api)
        await events.wait_for("session.created")
        await conn.session.update(session=session_update(api, turn_detection=None, text_only=True))
        updated = await events.wait_for("session.updated")
        assert turn_detection(updated.session, api) is None and text_only(updated.session, api)

        await conn.send({"type": "input_audio_buffer.commit"})  # nothing appended yet
        assert (await events.wait_for("error")).error.code == "input_audio_buffer_commit_empty"
        await conn.send({"type": "input_audio_buffer.append", "audio": ""})  # nothing appended
        await conn.send({"type": "input_audio_buffer.commit"})
        assert (await events.wait_for("error", count=2)).error.code == "input_audio_buffer_commit_empty"
        await conn.send({"type": "input_audio_buffer.append", "audio": "%%%"})
        bad = await events.wait_for("error", count=3)
        assert bad.error.code == "invalid_audio" and "base64" in bad.error.message
        if api == "ga":
            await conn.session.update(
                session={"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcmu"}}}}
            )
        else:
            await conn.session.update(session={"input_audio_format": "g711_ulaw"})
        bad = await events.wait_for("error", count=4)
        param = "session.audio.input.format" if api == "ga" else "session.input_audio_format"
        assert bad.error.code == "unsupported_format" and bad.error.param == param

        # Absences proven by order, not by waiting: the socket handles a client's events one at
        # a time, in order (a VAD's commit is queued while its audio is handled), and the
        # session takes committed turns, text items and response.create from one queue, in
        # order, a turn's answer started (response.created sent) before the next is taken. The
        # speech ends in more silence than the server's VAD needs to end a turn ([vad] silence_ms).
        await say(conn, np.concatenate([speech[0], silence(0.8)]))
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there."}]}
        )
        text_item = await events.wait_for("conversation.item.added")
        assert text_item.item.role == "user" and text_item.item.content[0].text == "Hello there."
        assert not events.of_type("input_audio_buffer.committed")  # no VAD: nothing happens by itself
        await conn.input_audio_buffer.commit()
        committed = await events.wait_for("input_audio_buffer.committed")
        assert committed.previous_item_id == text_item.item.id
        await conn.response.create()
        done = await events.wait_for("response.done")
        assert done.response.status in ("completed", "incomplete"), done
        assert "".join(e.delta for e in events.of_type("response.output_text.delta")) == done.response.text
        assert done.response.output[0].content[0].type == ("output_text" if api == "ga" else "text")
        assert not events.of_type("response.output_audio.delta")  # text only
        # The conversation now ends with an answer: nothing to answer, and the response ends
        # failed (a client waiting for its response.done is not left waiting).
        await conn.response.create()
        refused = await events.wait_for("response.done", count=2)
        assert refused.response.status == "failed" and refused.response.status_details.error.code == "no_user_turn"
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Bye."}]}
        )
        await events.until(
            lambda: [
                e
                for e in events.of_type("conversation.item.added")
                if e.item.role == "user" and getattr(e.item.content[0], "text", None) == "Bye."
            ]
        )
        # A manual commit does not answer by itself: had it, that answer would have come first
        # and the response.create asked for would have found nothing to answer.
        assert len(events.of_type("response.created")) == 2 and len(events.of_type("error")) == 4, [
            e.type for e in events.items
        ]


@pytest.mark.parametrize("api", APIS)
async def test_a_commit_with_the_vad_on_ends_the_utterance_it_hears(v1_server, speech, openai_client, api):
    """A push-to-talk client may commit while the server's VAD is on (OpenAI lets it): the
    utterance being heard ends there (speech_stopped, then committed, under the item id its
    speech_started named), and no response follows (OpenAI's commit creates none); with no
    speech being heard there is nothing to commit."""
    async with connect(openai_client, api) as conn:
        events = Events(conn, api)
        await events.wait_for("session.created")
        await conn.send({"type": "input_audio_buffer.commit", "event_id": "ev_early"})
        early = (await events.wait_for("error")).error
        assert (early.code, early.event_id) == ("input_audio_buffer_commit_empty", "ev_early")

        await say(conn, np.concatenate([silence(0.3), speech[0]]))  # no silence after it: the VAD has not ended it
        started = await events.wait_for("input_audio_buffer.speech_started")
        await conn.input_audio_buffer.commit()
        committed = await events.wait_for("input_audio_buffer.committed")
        stopped = events.of_type("input_audio_buffer.speech_stopped")
        assert [e.item_id for e in stopped] == [started.item_id] == [committed.item_id]
        assert events.position(stopped[0]) < events.position(committed)
        assert started.audio_start_ms < stopped[0].audio_end_ms

        await conn.send({"type": "conversation.item.retrieve", "item_id": committed.item_id})
        item = (await events.wait_for("conversation.item.retrieved")).item
        assert item.id == committed.item_id and item.role == "user"
        await say(conn, silence(1.0))  # (the VAD hears no more speech: nothing else is committed)
        await conn.send({"type": "input_audio_buffer.commit", "event_id": "ev_late"})
        late = (await events.wait_for("error", count=2)).error
        assert (late.code, late.event_id) == ("input_audio_buffer_commit_empty", "ev_late")
        assert not events.of_type("response.created") and len(events.of_type("input_audio_buffer.committed")) == 1


async def test_response_create_while_one_runs_and_early_cancels(v1_server, speech, openai_client):
    """A second response.create is refused while a response runs (the running one is not lost); a
    response.cancel right after response.create cancels it though it had not started; one with
    nothing to cancel is an error, as OpenAI answers each."""
    async with connect(openai_client, "ga") as conn:
        events = Events(conn, "ga")
        await events.wait_for("session.created")
        await conn.session.update(session=session_update("ga", turn_detection=None, text_only=True))
        await events.wait_for("session.updated")
        await conn.send({"type": "output_audio_buffer.clear"})  # "stop what plays": nothing does, no error
        await conn.response.cancel()
        assert (await events.wait_for("error")).error.code == "response_cancel_not_active"
        await conn.session.update(session=session_update("ga", text_only=True))
        await events.wait_for("session.updated", count=2)  # events are handled in order: any error came before
        assert len(events.of_type("error")) == 1, [e.error for e in events.of_type("error")]

        await say(conn, speech[0])
        await conn.input_audio_buffer.commit()
        await conn.response.create(response={"max_output_tokens": 20})
        await conn.response.create(response={"max_output_tokens": 20})
        refused = await events.wait_for("error", count=2)
        assert refused.error.code == "conversation_already_has_active_response", refused
        first = await events.wait_for("response.done")
        assert first.response.status in ("completed", "incomplete") and len(events.of_type("response.created")) == 1

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
        async with http.get(f"{v1_server}/v1/realtime?intent=translation") as resp:
            body = await resp.json()
            assert resp.status == 400 and body["error"]["param"] == "intent", body
        async with http.ws_connect(f"{v1_server}/v1/realtime") as ws:
            assert json.loads((await ws.receive()).data)["type"] == "session.created"
            await ws.send_bytes(b"\x00\x01")
            await ws.send_str("{" * 5000)
            errors = [json.loads((await ws.receive()).data) for _ in range(2)]
            assert [e["error"]["code"] for e in errors] == ["invalid_event", "invalid_json"], errors


@pytest.mark.parametrize(
    "protocols, headers, api",
    [
        ((), {}, "ga"),
        ((), {"OpenAI-Beta": "realtime=v1"}, "beta"),
        # A browser's WebSocket (openai-node): its key rides in a subprotocol, never echoed.
        (("realtime", "openai-insecure-api-key.sk-test"), {}, "ga"),
        (("realtime", "openai-insecure-api-key.sk-test", "openai-beta.realtime-v1"), {}, "beta"),
    ],
)
async def test_the_client_picks_its_shape_at_the_upgrade(v1_server, protocols, headers, api):
    """GA unless the client asks for beta (header or subprotocol); session.created is the first
    event, in that shape; a browser is answered with a subprotocol it offered."""
    async with aiohttp.ClientSession() as http:
        url = f"{v1_server}/v1/realtime?model=gpt-realtime-2"
        async with http.ws_connect(url, protocols=protocols, headers=headers) as ws:
            assert ws.protocol == ("realtime" if protocols else None)
            created = json.loads((await ws.receive()).data)
            check(created, api)
            assert created["type"] == "session.created"
            assert ("type" in created["session"]) == (api == "ga")
            # An error names the field and the client event at fault (OpenAI's error.event_id),
            # found wrong as it is parsed or as it is handled.
            item = {"type": "message", "role": "user"}
            await ws.send_json({"type": "conversation.item.create", "event_id": "client_1", "item": item})
            await ws.send_json({"type": "response.cancel", "event_id": "client_2"})
            errors = [json.loads((await ws.receive()).data) for _ in range(2)]
            for error in errors:
                check(error, api)
            assert [(e["error"]["param"], e["error"]["event_id"]) for e in errors] == [
                ("item.content", "client_1"),
                (None, "client_2"),
            ], errors
