"""Realtime sessions in either shape with the official `openai` client, for tests that run the
same conversation as a GA client (`client.realtime.connect()`) and as a beta one
(`client.beta.realtime.connect()`): the connection, and the session settings written and read
the way each shape's clients write and read them; a session opened with some settings, and a
user's text or spoken item."""

from __future__ import annotations

import base64
from typing import Any

from kimiaudio.audio import pcm16
from kimiaudio.audio.resampling import resample

from helpers.realtime_events import MODEL, Events

APIS = ("ga", "beta")
UNSET: Any = object()


def connect(client, api: str, model: str = MODEL, **options):
    """The connection manager of `client` for the shape `api` (`async with` opens it)."""
    if api == "ga":
        return client.realtime.connect(model=model, **options)
    return client.beta.realtime.connect(model=model, **options)


def session_update(
    api: str,
    *,
    turn_detection: Any = UNSET,
    text_only: bool | None = None,
    transcription: Any = UNSET,
    input_rate: int | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A session.update's `session` in the shape `api`: turn detection (a dict or None), text
    answers, input transcription (a dict or None), 16 kHz input (kimiaudio's), and any field
    both shapes name alike (instructions, kimiaudio's vad and sampling)."""
    if api == "beta":
        session: dict[str, Any] = dict(fields)
        if turn_detection is not UNSET:
            session["turn_detection"] = turn_detection
        if text_only is not None:
            session["modalities"] = ["text"] if text_only else ["text", "audio"]
        if transcription is not UNSET:
            session["input_audio_transcription"] = transcription
        if input_rate is not None:  # beta's pcm16 is 24 kHz; kimiaudio takes GA's format object in either shape
            session["audio"] = {"input": {"format": {"type": "audio/pcm", "rate": input_rate}}}
        return session
    audio_in: dict[str, Any] = {}
    if turn_detection is not UNSET:
        audio_in["turn_detection"] = turn_detection
    if transcription is not UNSET:
        audio_in["transcription"] = transcription
    if input_rate is not None:
        audio_in["format"] = {"type": "audio/pcm", "rate": input_rate}
    session = {"type": "realtime", **fields}
    if audio_in:
        session["audio"] = {"input": audio_in}
    if text_only is not None:
        session["output_modalities"] = ["text"] if text_only else ["audio"]
    return session


def turn_detection(session, api: str):
    """The turn detection a session.created / .updated reports (None: the client commits)."""
    return session.turn_detection if api == "beta" else session.audio.input.turn_detection


def transcription(session, api: str):
    """The input transcription a session.created / .updated reports (None: off)."""
    return session.input_audio_transcription if api == "beta" else session.audio.input.transcription


def text_only(session, api: str) -> bool:
    return (session.modalities if api == "beta" else session.output_modalities) == ["text"]


async def open_session(conn, api: str = "ga", **fields) -> Events:
    """The events of `conn` once its session has taken session_update(api, **fields)."""
    events = Events(conn, api)
    await events.wait_for("session.created")
    await conn.session.update(session=session_update(api, **fields))
    await events.wait_for("session.updated")
    return events


def user_text(text: str, item_id: str | None = None) -> dict:
    """A user message item of one text part (with the client's id, if given)."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return item | ({"id": item_id} if item_id else {})


def user_audio(pcm_16k) -> dict:
    """A user message item of one input_audio part: 16 kHz audio as pcm16 at the session's 24 kHz."""
    audio = base64.b64encode(pcm16.to_bytes(resample(pcm_16k, 16000, 24000))).decode()
    return {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio}]}


def client_of(http, api_key: str = "unused"):
    """The official `openai` async client of a test server (aiohttp's test client `http`), for
    its HTTP routes and its Realtime WebSocket; the caller closes it."""
    import openai

    port = http.server.port
    return openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key=api_key,
        max_retries=0,
        websocket_base_url=f"ws://127.0.0.1:{port}/v1",
    )


async def answer_playing(conn, events: Events, text: str = "Tell me a story.") -> tuple[str, str]:
    """A user text item, then a response whose audio has begun to play -> (its response id, its
    item id). The demo server's pipeline must answer to its limit (`answers_to_limit`), so that
    the answer still plays when the test acts on it."""
    await conn.conversation.item.create(item=user_text(text))
    await conn.response.create()
    count = len(events.of_type("response.created")) + 1
    response_id = (await events.wait_for("response.created", count=count)).response.id
    item_id = (await events.wait_for("response.output_item.added", count=count)).item.id
    await events.until(lambda: events.audio_seconds(response_id) > 0.2 or events.done(response_id))
    assert not events.done(response_id), "the answer ended before the test acted on it"
    return response_id, item_id
