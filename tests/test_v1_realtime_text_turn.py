"""A written user turn over GET /v1/realtime with the official `openai` client, as a GA client
(`client.realtime.connect()`) and as a beta one (`client.beta.realtime.connect()`), against a
real `serve` on the demo checkpoint: a user text item (conversation.item.create, input_text)
then response.create is answered, speech and its transcript (text alone when the response asks
for text), with the session's settings as they were when it was sent, and stored like any turn;
a response.create with no user turn to answer ends failed, `no_user_turn`. The demo weights
answer with noise: the checks are about what was generated, streamed and stored, not about
words."""

import base64

import numpy as np
import pytest

from helpers.realtime_events import Events, conversation
from helpers.realtime_sessions import APIS, connect, open_session, session_update, text_only, user_text

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow


def text_response(api: str) -> dict:
    """A response.create's `response` asking for text alone, in the shape `api`."""
    return {"output_modalities": ["text"]} if api == "ga" else {"modalities": ["text"]}


@pytest.mark.parametrize("api", APIS)
async def test_a_text_item_is_answered_with_speech_or_text(v1_server, openai_client, api):
    async with connect(openai_client, api) as conn:
        events = Events(conn, api)
        await events.wait_for("session.created")
        # No user turn yet: nothing to answer, said as the response's failure.
        await conn.response.create()
        refused = await events.wait_for("response.done")
        assert refused.response.status == "failed"
        assert refused.response.status_details.error.code == "no_user_turn"

        # The demo's greedy text ends at once: sampled text, so there is a transcript to check.
        sampling = {"text_temperature": 1.5, "text_top_k": 0}
        await conn.session.update(
            session=session_update(api, turn_detection=None, instructions="Answer briefly.", sampling=sampling)
        )
        await events.wait_for("session.updated")
        await conn.conversation.item.create(item=user_text("Tell me a joke."))
        asked = await events.wait_for("conversation.item.added")
        assert asked.item.role == "user" and asked.item.content[0].text == "Tell me a joke."
        conversation_id = events.of_type("conversation.created")[0].conversation.id

        # Text in, speech out (the session's output): audio deltas and their transcript.
        await conn.response.create()
        spoken = await events.wait_for("response.done", count=2)
        assert spoken.response.status in ("completed", "incomplete"), spoken
        rid = spoken.response.id
        audio = [e for e in events.of_type("response.output_audio.delta") if e.response_id == rid]
        pcm = np.frombuffer(b"".join(base64.b64decode(e.delta) for e in audio), "<i2")
        assert pcm.size > 0 and np.abs(pcm).max() > 300  # the demo's noise speech, not silence
        transcript_deltas = [
            e for e in events.of_type("response.output_audio_transcript.delta") if e.response_id == rid
        ]
        transcript = "".join(e.delta for e in transcript_deltas)
        assert transcript_deltas and transcript == spoken.response.output[0].content[0].transcript
        assert not [e for e in events.of_type("response.output_text.delta") if e.response_id == rid]

        # The conversation ends with that answer: nothing new to answer.
        await conn.response.create()
        again = await events.wait_for("response.done", count=3)
        assert again.response.status == "failed" and again.response.status_details.error.code == "no_user_turn"

        # Text in, text out (this response asks for text alone).
        await conn.conversation.item.create(item=user_text("And another one."))
        await events.until(
            lambda: len([e for e in events.of_type("conversation.item.added") if e.item.role == "user"]) == 2
        )
        await conn.response.create(response=text_response(api))
        written = await events.wait_for("response.done", count=4)
        assert written.response.status in ("completed", "incomplete"), written
        rid = written.response.id
        text = "".join(e.delta for e in events.of_type("response.output_text.delta") if e.response_id == rid)
        assert text and text == written.response.output[0].content[0].text
        assert not [e for e in events.of_type("response.output_audio.delta") if e.response_id == rid]
        assert not events.invalid

    turns = (await conversation(v1_server, conversation_id))["turns"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant"]
    assert [turns[0]["text"], turns[2]["text"]] == ["Tell me a joke.", "And another one."]
    assert turns[1]["text"] == transcript and turns[1]["duration_s"] == pytest.approx(pcm.size / 24000, abs=0.01)
    assert turns[3]["text"] == text and not turns[3]["audio_tokens"]


@pytest.mark.parametrize("api", APIS)
async def test_a_session_update_sent_after_a_response_create_is_for_the_next_one(v1_server, openai_client, api):
    """The response.create waits behind its item in the session's queue; a session.update sent
    after it is applied at once, but the response is answered as the client asked for it then,
    spoken (OpenAI takes the events in the order they come)."""
    async with connect(openai_client, api) as conn:
        events = await open_session(conn, api, turn_detection=None)
        for text in ("Hello.", "Something funny, please.", "Tell me a joke."):  # (the queue's work)
            await conn.conversation.item.create(item=user_text(text))
        await conn.response.create()
        await conn.session.update(session=session_update(api, text_only=True, instructions="Answer in one word."))
        updated = await events.wait_for("session.updated", count=2)
        assert text_only(updated.session, api)
        first = await events.wait_for("response.done")
        assert not text_only(first.response, api), first.response
        assert first.response.output[0].content[0].type in ("audio", "output_audio")

        await conn.conversation.item.create(item=user_text("And another one."))
        await conn.response.create()
        second = await events.wait_for("response.done", count=2)
        assert text_only(second.response, api) and second.response.output[0].content[0].type in ("text", "output_text")
        assert not events.invalid
