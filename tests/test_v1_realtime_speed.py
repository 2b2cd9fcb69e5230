"""OpenAI's `audio.output.speed` (beta: `speed`) with the official `openai` client against a real
server on the demo checkpoint: session.updated reports it, and the next answer's audio is that
much shorter or longer than the audio its codes make (the audio is stretched as it streams,
audio/time_stretch.py); a speed outside 0.25..1.5 is an `error` naming the field, and the
session keeps its speed."""

import pytest

from helpers.realtime_events import Events
from helpers.realtime_sessions import APIS, client_of, connect, session_update, user_text

openai = pytest.importorskip("openai")
pytest.importorskip("websockets", reason="the openai client's Realtime connection needs openai[realtime]")
pytestmark = pytest.mark.slow

POSITIONS = 30  # every answer runs to this many positions


def with_speed(api: str, speed: float) -> dict:
    session = session_update(api, turn_detection=None, max_output_tokens=POSITIONS)
    if api == "ga":
        return session | {"audio": {"output": {"speed": speed}}}
    return session | {"speed": speed}


def reported_speed(session, api: str) -> float:
    return session.audio.output.speed if api == "ga" else session.speed


async def answer_samples(conn, events: Events, pipeline, count: int) -> tuple[int, int]:
    """(24 kHz samples played, samples its codes make) of the next answer to a user text item."""
    await conn.conversation.item.create(item=user_text("Tell me a story."))
    await conn.response.create()
    done = (await events.wait_for("response.done", count=count)).response
    assert done.status == "incomplete", done  # (cut at max_output_tokens, as every answer here)
    codes = pipeline.handles[-1].done.audio_tokens
    assert codes
    return round(events.audio_seconds(done.id) * 24000), len(codes) * pipeline.samples_per_code


@pytest.mark.parametrize("api", APIS)
async def test_the_answers_audio_plays_at_the_sessions_speed(demo_server, api):
    async with demo_server() as (http, pipeline):
        pipeline.answers_to_limit = True
        client = client_of(http)
        try:
            async with connect(client, api) as conn:
                events = Events(conn, api)
                await events.wait_for("session.created")
                await conn.session.update(session=with_speed(api, 1.0))
                assert reported_speed((await events.wait_for("session.updated")).session, api) == 1.0
                played, generated = await answer_samples(conn, events, pipeline, 1)
                assert played == generated
                for count, speed in enumerate((1.5, 0.5), start=2):
                    await conn.session.update(session=with_speed(api, speed))
                    updated = await events.wait_for("session.updated", count=count)
                    assert reported_speed(updated.session, api) == speed
                    played, generated = await answer_samples(conn, events, pipeline, count)
                    assert played == round(generated / speed)

                await conn.send({"type": "session.update", "session": with_speed(api, 2.0), "event_id": "ev_fast"})
                error = (await events.wait_for("error")).error
                param = "session.audio.output.speed" if api == "ga" else "session.speed"
                assert (error.param, error.event_id) == (param, "ev_fast") and "0.25" in error.message
                played, generated = await answer_samples(conn, events, pipeline, 4)
                assert played == round(generated / 0.5)  # (still 0.5)
        finally:
            await client.close()
