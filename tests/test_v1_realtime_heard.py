"""What the conversation keeps of an answer cut short, with the official `openai` client against
the server app on the demo checkpoint (its pipeline recording what it was asked and what it
generated; every event checked against the SDK's models):

- an answer cancelled before anything of it was heard is no turn: the response.create after
  the response.cancel (a client's retry) answers the same user turn, and the cancelled answer's
  item reads back as OpenAI's, incomplete and empty;
- a spoken answer truncated keeps the text of what was heard, as OpenAI's truncate drops the
  unheard transcript: the text tokens of the positions up to the last code heard (the audio
  delay's, then one per code), the text they decode to, in the store, in the item read back
  and in the next prompt; the transcript events already sent are not taken back;
- while a spoken answer plays, its stored record holds the text of what was heard so far
  (the same rule), not all the text sent, which runs ahead of the audio;
- an answer played out whole and only being stored when a response.cancel (or a barge-in)
  comes is complete: nothing of it is cut, and the cancel is no error;
- a response that fails still echoes its response.create's metadata and voice.
"""

import asyncio
import math

import pytest

from kimiaudio.server.session.conversation import Conversation

from helpers.realtime_events import say
from helpers.realtime_sessions import client_of, connect, open_session, user_text
from helpers.waiting import eventually

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow


async def stored_turns(http, conversation_id: str) -> list[dict]:
    return (await (await http.get(f"/api/conversations/{conversation_id}")).json())["turns"]


async def test_a_response_cancelled_before_it_was_heard_is_retried(demo_server):
    async with demo_server() as (http, pipeline):
        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn, turn_detection=None)
                # Nothing to answer yet: failed, with what the response.create asked echoed.
                asked = {"metadata": {"attempt": "0"}, "audio": {"output": {"voice": "alloy"}}}
                await conn.response.create(response=asked)
                failed = (await events.wait_for("response.done")).response
                assert (failed.status, failed.status_details.error.code) == ("failed", "no_user_turn")
                assert failed.metadata == {"attempt": "0"} and failed.audio.output.voice == "alloy"

                await conn.conversation.item.create(item=user_text("Tell me a story."))
                await conn.response.create(response={"metadata": {"attempt": "1"}})
                await conn.response.cancel()  # before its first audio: nothing of it is heard
                await conn.response.create(response={"metadata": {"attempt": "2"}})
                cancelled = (await events.wait_for("response.done", count=2)).response
                retried = (await events.wait_for("response.done", count=3)).response
                await conn.send({"type": "conversation.item.retrieve", "item_id": cancelled.output[0].id})
                unheard = (await events.wait_for("conversation.item.retrieved")).item
        finally:
            await client.close()
        assert (cancelled.status, cancelled.status_details.reason) == ("cancelled", "client_cancelled")
        assert cancelled.metadata == {"attempt": "1"}
        assert retried.status in ("completed", "incomplete"), retried.status_details
        assert retried.metadata == {"attempt": "2"}
        assert [r.user_text for r in pipeline.requests] == ["Tell me a story."] * 2  # the same user turn
        assert pipeline.requests[1].history == []  # the cancelled answer is in no prompt
        assert (unheard.status, unheard.content) == ("incomplete", [])
        turns = await stored_turns(http, retried.conversation_id)
        assert [(t["role"], t["text"]) for t in turns] == [
            ("user", "Tell me a story."),
            ("assistant", retried.output[0].content[0].transcript),
        ]


async def test_a_cancel_after_the_answer_played_out_leaves_it_complete(demo_server, speech_16k, monkeypatch):
    storing, release = asyncio.Event(), asyncio.Event()
    update_assistant = Conversation.update_assistant

    async def held(self, *args, **kwargs):  # the final record of an answer heard whole, held back
        storing.set()
        await release.wait()
        return await update_assistant(self, *args, **kwargs)

    monkeypatch.setattr(Conversation, "update_assistant", held)
    async with demo_server() as (http, pipeline):
        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                events = await open_session(conn, turn_detection=None)
                await say(conn, speech_16k)
                await conn.input_audio_buffer.commit()
                await conn.response.create()
                created = (await events.wait_for("response.created")).response
                await storing.wait()  # played out (the WebSocket's clock passed its end), being stored
                assert events.audio_seconds(created.id) > 0 and not events.done(created.id)
                await conn.response.cancel()
                await conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
                await events.wait_for("session.updated", count=2)  # the cancel was handled before it
                release.set()
                done = (await events.wait_for("response.done")).response
        finally:
            await client.close()
        assert not events.of_type("error"), [e.error for e in events.of_type("error")]
        assert not events.of_type("output_audio_buffer.cleared")
        assert done.status in ("completed", "incomplete"), done.status_details  # (the demo may run to its limit)
        said = (await stored_turns(http, done.conversation_id))[1]
        generated = pipeline.handles[0].done
        assert not said["interrupted"] and said["audio_tokens"] == list(generated.audio_tokens)
        assert said["text"] == done.output[0].content[0].transcript


def heard_text(stack, text_tokens: list[int], codes: int) -> str:
    """The text of the first `codes` codes heard, as heard_text.py keeps it: the valid ids of the
    audio delay's positions and one per code (before the text EOS, below the audio offset),
    decoded, without a character the cut split if the text went on after it."""
    specials = stack.specials
    kept = text_tokens[: specials.audio_delay + codes] if codes else []
    ended = kept.index(specials.text_eos) if specials.text_eos in kept else None
    heard = stack.tokenizer.decode(t for t in kept[:ended] if t < specials.token_offset)
    return heard if ended is not None else heard.rstrip("\ufffd")


async def test_the_record_of_an_answer_playing_holds_the_text_heard(demo_server, speech_16k):
    async with demo_server() as (http, pipeline):
        pipeline.answers_to_limit = True
        client = client_of(http)
        try:
            async with connect(client, "ga") as conn:
                sampling = {"seed": 2, "text_temperature": 1.0, "text_top_k": 50}  # text that goes on
                events = await open_session(conn, turn_detection=None, max_output_tokens=80, sampling=sampling)
                await say(conn, speech_16k)
                await conn.input_audio_buffer.commit()
                await conn.response.create()
                created = (await events.wait_for("response.created")).response

                async def recorded():  # the record written while it plays, once something was heard
                    turns = await stored_turns(http, created.conversation_id)
                    return len(turns) > 1 and turns[1]["audio_tokens"] and not events.done(created.id) and turns[1]

                playing = await eventually(recorded, "a record of the answer with audio heard")
                sent = "".join(e.delta for e in events.of_type("response.output_audio_transcript.delta"))
                await conn.response.cancel()
                await events.wait_for("response.done")
        finally:
            await client.close()
        generated = pipeline.handles[0].done
        assert playing["text"] == heard_text(pipeline.stack, list(generated.text_tokens), len(playing["audio_tokens"]))
        assert sent.startswith(playing["text"])


async def test_a_truncated_answer_keeps_the_text_of_what_was_heard(demo_server, speech_16k):
    async with demo_server() as (http, pipeline):
        pipeline.answers_to_limit = True  # still playing when the truncate comes, whatever it says
        client = client_of(http)
        heard_ms = 200
        try:
            async with connect(client, "ga") as conn:
                # Sampled text: the demo's greedy text ends within the audio delay; this goes on past the cut.
                sampling = {"seed": 2, "text_temperature": 1.0, "text_top_k": 50}
                events = await open_session(conn, turn_detection=None, max_output_tokens=80, sampling=sampling)
                await say(conn, speech_16k)
                await conn.input_audio_buffer.commit()
                await conn.response.create()
                created = (await events.wait_for("response.created")).response
                rid = created.id
                item_id = (await events.wait_for("response.output_item.added")).item.id
                await events.until(lambda: events.audio_seconds(rid) >= 2 * heard_ms / 1000 or events.done(rid))
                assert not events.done(rid), "the answer ended before the truncate"
                await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=heard_ms)
                await events.wait_for("conversation.item.truncated")
                # Told of the cut, the client may count on it: a crash now would keep it.
                stored_when_told = (await stored_turns(http, created.conversation_id))[1:]
                done = (await events.wait_for("response.done")).response
                # openai-agents' interrupt(): truncate, then cancel; the cut answer may have ended
                # in between, and the cancel is still no error.
                await conn.response.cancel()
                await conn.send({"type": "conversation.item.retrieve", "item_id": item_id})
                retrieved = (await events.wait_for("conversation.item.retrieved")).item
                await conn.conversation.item.create(item=user_text("And then?"))
                await conn.response.create()
                await events.wait_for("response.done", count=2)
        finally:
            await client.close()
        assert not events.of_type("error"), [e.error for e in events.of_type("error")]
        assert done.status == "cancelled", done.status_details
        generated = pipeline.handles[0].done  # what the pipeline generated before the cut
        sent = "".join(
            e.delta for e in events.of_type("response.output_audio_transcript.delta") if e.response_id == rid
        )
        assert done.output[0].content[0].transcript == sent  # not taken back

        codes = math.ceil(heard_ms * 24 / pipeline.samples_per_code)  # (24 kHz: 24 samples a ms)
        positions = pipeline.stack.specials.audio_delay + codes
        assert len(generated.text_tokens) > positions  # more was generated than was heard
        said = (await stored_turns(http, done.conversation_id))[1]
        kept = ("text", "text_tokens", "audio_tokens", "interrupted", "duration_s")
        assert [{k: t[k] for k in kept} for t in stored_when_told] == [{k: said[k] for k in kept}]
        assert said["interrupted"] and said["audio_tokens"] == list(generated.audio_tokens[:codes])
        assert said["text_tokens"] == list(generated.text_tokens[:positions])
        heard = heard_text(pipeline.stack, list(generated.text_tokens), codes)
        assert said["text"] == heard and sent.startswith(heard)
        assert retrieved.content[0].transcript == heard
        answer = pipeline.requests[1].history[-1]  # the next prompt: the answer as it was heard
        assert (answer.role, answer.text, answer.audio_tokens) == ("assistant", heard, said["audio_tokens"])
