"""The user's words over /v1/realtime with the official `openai` client against a real
`serve` (demo checkpoint), GA and beta: with input_audio_transcription set, each committed user
turn is transcribed by the engine beside the answer, sent as OpenAI's
conversation.item.input_audio_transcription.delta events and .completed, stored with the turn
and found by GET /api/conversations?q=; without it, nothing of the kind happens. A
transcription session (GA `?intent=transcription`, beta `transcription_session.update`) hears
turns with server VAD and transcribes them, answering none; with `include` naming
item.input_audio_transcription.logprobs (GA), its words come with their tokens' logprobs. The
demo weights' words are random tokens, so the transcript is checked against what an ASR request
on the same stored audio produces (the server's sampling seed is fixed: the same audio, the same words)."""

import base64
from urllib.parse import urlencode

import aiohttp
import numpy as np
import pytest

from kimiaudio.audio import pcm16
from kimiaudio.store.search import query_tokens

from helpers.audio import silence
from helpers.realtime_events import MODEL, Events, conversation, say
from helpers.realtime_sessions import APIS, connect, session_update, transcription

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow

PCM16K = 16000  # input at the speech encoders' rate: no resampling on the way in


async def commit_speech(conn, events: Events, pcm16k: np.ndarray, count: int):
    data = pcm16.to_bytes(pcm16k)
    for start in range(0, len(data), 6400):
        await conn.input_audio_buffer.append(audio=base64.b64encode(data[start : start + 6400]).decode())
    await conn.input_audio_buffer.commit()
    committed = await events.wait_for("input_audio_buffer.committed", count=count)
    await conn.response.create()
    done = await events.wait_for("response.done", count=count)
    assert done.response.status in ("completed", "incomplete"), done
    return committed, done


async def get_json(url: str):
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as resp:
            return resp.status, await resp.json()


async def found(base: str, q: str) -> list[str]:
    """The ids of the conversations GET /api/conversations?q= finds (a 200)."""
    status, body = await get_json(f"{base}/api/conversations?{urlencode({'q': q})}")
    assert status == 200, (q, body)
    return [c["id"] for c in body["conversations"]]


@pytest.mark.parametrize("api", APIS)
async def test_input_transcription_is_sent_stored_and_searchable(v1_server, speech, openai_client, api):
    async with connect(openai_client, api) as conn:
        events = Events(conn, api)
        created = await events.wait_for("session.created")
        assert transcription(created.session, api) is None  # off unless asked for, as OpenAI's
        await conn.session.update(
            session=session_update(
                api, turn_detection=None, text_only=True, transcription={"model": "whisper-1"}, input_rate=PCM16K
            )
        )
        updated = await events.wait_for("session.updated")
        assert transcription(updated.session, api).model == "whisper-1"
        committed, done = await commit_speech(conn, events, np.concatenate([speech[0], silence(0.3)]), 1)
        completed = await events.wait_for("conversation.item.input_audio_transcription.completed")
        assert completed.item_id == committed.item_id and completed.content_index == 0
        deltas = events.of_type("conversation.item.input_audio_transcription.delta")
        assert {(d.item_id, d.content_index) for d in deltas} <= {(committed.item_id, 0)}
        assert "".join(d.delta for d in deltas).strip() == completed.transcript
        assert completed.usage.type == "duration" and completed.usage.seconds == pytest.approx(
            committed.model_extra["duration_s"], abs=0.01
        )
        assert not events.of_type("conversation.item.input_audio_transcription.failed")
        conversation_id = committed.model_extra["conversation_id"]

    transcript = completed.transcript
    stored = await conversation(v1_server, conversation_id)
    user = stored["turns"][committed.model_extra["item_index"]]
    assert user["role"] == "user" and user["transcript"] == transcript
    assert stored["turns"][-1]["transcript"] is None  # the answer's words are its text
    # What an ASR request makes of the same (stored) audio: the same words.
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{v1_server}/api/conversations/{conversation_id}/turns/{user['index']}/audio") as resp:
            wav = await resp.read()
    asr = await openai_client.audio.transcriptions.create(model=MODEL, file=("turn.wav", wav))
    assert transcript and asr.text == transcript

    # Found by what was said: the demo's words are random tokens, often no letters at all, so
    # the transcript is looked for by its letters and digits where it has some (the answer has
    # no transcript to be found by).
    if query_tokens([transcript]):
        assert conversation_id in await found(v1_server, transcript), transcript
    # FTS syntax around a word is text, never a 500 (test_store_search: the syntax on both
    # backends): words typed into a conversation of their own, found through the route.
    async with connect(openai_client, api) as conn:
        events = Events(conn, api)
        await events.wait_for("session.created")
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Pelicans near the crossing at dawn"}],
            }
        )
        typed = (await events.wait_for("conversation.item.added")).model_extra["conversation_id"]
    for q in ("pelic", '"pelicans', "NEAR(pelic dawn)", "(dawn) crossing", "-dawn", "CROSS*"):
        assert typed in await found(v1_server, q), q
    for q in ("zzzqqq-never-said", "*", '"', "pelicans OR zzzqqq"):
        assert await found(v1_server, q) == [], q
    status, body = await get_json(f"{v1_server}/api/conversations?q={'x' * 201}")
    assert status == 400 and body["error"]["param"] == "q" and "200 characters" in body["error"]["message"]


async def test_no_transcription_unless_asked_and_bad_settings_refused(v1_server, speech, openai_client):
    async with connect(openai_client, "ga") as conn:
        events = Events(conn, "ga")
        await events.wait_for("session.created")
        await conn.session.update(
            session=session_update(
                "ga", turn_detection=None, text_only=True, transcription={"model": "whisper-1", "language": "klingon"}
            )
        )
        bad = await events.wait_for("error")
        assert bad.error.param == "session.audio.input.transcription.language", bad
        await conn.session.update(
            session=session_update("ga", turn_detection=None, text_only=True, input_rate=PCM16K, transcription=None)
        )
        updated = await events.wait_for("session.updated")
        assert transcription(updated.session, "ga") is None
        said = np.concatenate([speech[1], silence(0.3)])
        committed, _ = await commit_speech(conn, events, said, 1)
        created = next(e for e in events.of_type("conversation.item.added") if e.item.id == committed.item_id)
        assert [c.type for c in created.item.content] == ["input_audio"] and created.item.content[0].transcript is None

        # Absence proven by order, not by waiting: the same audio again, with the words asked
        # for, and its transcription awaited. Had the first turn been transcribed, that request
        # would be this one's twin (the ASR prompt holds no history; the server's fixed seed: the
        # same audio, the same tokens, so the same number of engine steps), submitted before the
        # first answer even started (spawned as the turn was stored, its first step submits) and
        # so long before the second: the LM worker admits background turns in arrival order and
        # the scheduler decodes them oldest first, a position each per step, preempting the
        # newest. So it would have ended, and its event been sent, before the second turn's.
        await conn.session.update(session=session_update("ga", transcription={"model": "whisper-1"}))
        await events.wait_for("session.updated", count=2)
        data = pcm16.to_bytes(said)
        for start in range(0, len(data), 6400):
            await conn.input_audio_buffer.append(audio=base64.b64encode(data[start : start + 6400]).decode())
        await conn.input_audio_buffer.commit()
        second = await events.wait_for("input_audio_buffer.committed", count=2)
        completed = await events.wait_for("conversation.item.input_audio_transcription.completed")
        words = [e for e in events.items if e.type.startswith("conversation.item.input_audio_transcription")]
        assert {e.item_id for e in words} == {second.item_id}, words
        conversation_id = committed.model_extra["conversation_id"]
        assert second.model_extra["conversation_id"] == conversation_id
        stored = await conversation(v1_server, conversation_id)
        assert stored["turns"][committed.model_extra["item_index"]]["transcript"] is None
        assert stored["turns"][second.model_extra["item_index"]]["transcript"] == completed.transcript


@pytest.mark.parametrize("api", APIS)
async def test_a_transcription_session_transcribes_and_answers_nothing(v1_server, speech, openai_client, api):
    """GA: ?intent=transcription; beta: transcription_session.update. Server VAD commits each
    turn; its words come as deltas and a completion and are stored; no response is generated,
    and a response.create ends failed at once."""
    options = {"extra_query": {"intent": "transcription"}} if api == "ga" else {}
    async with connect(openai_client, api, **options) as conn:
        events = Events(conn, api)
        created = await events.wait_for("session.created")
        if api == "ga":
            assert created.session.type == "transcription" and created.session.audio.input.transcription.model
            assert created.session.include == []
            include = ["item.input_audio_transcription.logprobs"]
            await conn.session.update(session={"type": "transcription", "include": include})
            assert (await events.wait_for("session.updated")).session.include == include
        else:
            await conn.transcription_session.update(
                session={"input_audio_transcription": {"model": "gpt-4o-transcribe", "language": "en"}}
            )
            updated = await events.wait_for("transcription_session.updated")
            assert updated.session.input_audio_transcription.model == "gpt-4o-transcribe"
            assert updated.session.turn_detection.type == "server_vad"
        await say(conn, np.concatenate([silence(0.3), speech[0], silence(1.0)]))
        committed = await events.wait_for("input_audio_buffer.committed")
        completed = await events.wait_for("conversation.item.input_audio_transcription.completed")
        assert completed.item_id == committed.item_id and completed.content_index == 0
        deltas = events.of_type("conversation.item.input_audio_transcription.delta")
        assert "".join(d.delta for d in deltas).strip() == completed.transcript
        if api == "ga":  # each token once, its logprob beside it, in the deltas as in the completion
            tokens = [(p.token, p.logprob, p.bytes) for p in completed.logprobs]
            assert tokens and all(logprob <= 0 for _, logprob, _ in tokens)
            assert [(p.token, p.logprob, p.bytes) for d in deltas for p in d.logprobs] == tokens
            assert "".join(token for token, _, _ in tokens).strip() == completed.transcript
        await conn.response.create()
        refused = await events.wait_for("response.done")
        assert (
            refused.response.status == "failed"
            and refused.response.status_details.error.code == "transcription_session"
        )
        # Nothing was generated for the turn: the only response is the refused one.
        assert [e.response.id for e in events.of_type("response.created")] == [refused.response.id]
        conversation_id = committed.model_extra["conversation_id"]
    turns = (await conversation(v1_server, conversation_id))["turns"]
    assert [(t["role"], t["has_audio"], t["transcript"]) for t in turns] == [("user", True, completed.transcript)]
