"""Every surface's error holds the same object, built in one place (server/api_error.py):
OpenAI's `{"message", "type", "param", "code"}` in that order, as an HTTP body `{"error": ...}`
(/api, /v1) or an event `{"type": "error", "error": ...}` (the /v1 server-sent streams, the
Realtime WebSocket). `error_object` is patched to mark what it builds, so a surface that
wrote its own body would fail its case for want of the mark."""

import json
from types import SimpleNamespace

import pytest
from aiohttp import web

from kimiaudio.pipeline.events import TextDelta, TurnDone
from kimiaudio.server import api_error
from kimiaudio.server.v1 import chat_stream, transcriptions
from kimiaudio.server.v1.chat_body import ChatAnswerForm, ChatStreaming

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
FIELDS = ["message", "type", "param", "code"]
MARK = "built_by_error_object"


@pytest.fixture(autouse=True)
def marked(monkeypatch):
    real = api_error.error_object
    monkeypatch.setattr(api_error, "error_object", lambda *args: {**real(*args), MARK: True})


def check(error: dict, code: str, kind: str = "invalid_request_error", extra: tuple = ()) -> None:
    assert list(error) == FIELDS + [MARK, *extra], error
    assert error["code"] == code and error["type"] == kind and error["message"], error


async def failed_turn():
    yield TextDelta("partial ")
    yield TurnDone(status="failed", error="the LM worker stopped")


async def test_http_bodies_and_the_realtime_event(demo_server):
    async with demo_server() as (http, _):
        rest = await http.get("/api/conversations/nope")  # a handler's ApiError
        assert rest.status == 404 and list(await rest.json()) == ["error"]
        check((await rest.json())["error"], "conversation_not_found")
        bad_json = await http.post("/api/rtc/offer", data=b"{nope", headers={"Content-Type": "application/json"})
        assert bad_json.status == 400  # made by the error middleware from a JsonInputError
        check((await bad_json.json())["error"], "invalid_json")
        v1 = await http.post("/v1/chat/completions", json={"model": "gpt-4-turbo", "messages": []})
        assert v1.status == 404
        assert list(await v1.json()) == ["error"]
        check((await v1.json())["error"], "model_not_found")
        assert (await v1.json())["error"]["param"] == "model"
        async with http.ws_connect("/v1/realtime") as ws:
            assert json.loads((await ws.receive()).data)["type"] == "session.created"
            await ws.send_bytes(b"\x00\x01")
            event = json.loads((await ws.receive()).data)
        assert list(event) == ["event_id", "type", "error"] and event["type"] == "error"
        check(event["error"], "invalid_event", extra=("event_id",))  # OpenAI's: the client event at fault


async def stream_events(aiohttp_client, handler) -> list[dict]:
    app = web.Application()
    app.router.add_post("/", handler)
    http = await aiohttp_client(app)
    resp = await http.post("/")
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    blocks = (await resp.text()).split("\n\n")
    assert blocks[-2:] == ["data: [DONE]", ""]
    return [json.loads(block.removeprefix("data: ")) for block in blocks[:-2]]


async def test_the_streams_send_the_same_error_event(aiohttp_client):
    async def chat(request):
        options = SimpleNamespace(answer=ChatAnswerForm("text", "", None), streaming=ChatStreaming(True, False))
        return await chat_stream.stream_answer(request, failed_turn(), options, {"id": "chatcmpl-1"}, None, 0)

    async def transcription(request):
        return await transcriptions._stream(request, failed_turn(), False)

    for handler, code in ((chat, "generation_failed"), (transcription, "transcription_failed")):
        last = (await stream_events(aiohttp_client, handler))[-1]
        assert list(last) == ["type", "error"] and last["type"] == "error", last
        check(last["error"], code, kind="server_error")
        assert "the LM worker stopped" in last["error"]["message"]
