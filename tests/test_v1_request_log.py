"""The /v1 request log of a real `serve` process: a client that hangs up is no server error (one
`status=499 cancelled=client_closed` line, nothing in kimiaudio_errors_total), and a path
holding newlines, carriage returns or NULs stays on its one line, escaped."""

import asyncio
import base64
import socket

import aiohttp
import numpy as np
import pytest
import yarl

from kimiaudio.audio.io import wav_bytes
from kimiaudio.server.observe.log_values import key_values, log_value

from helpers.metrics_scrape import scrape
from helpers.waiting import eventually

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

MODEL = "kimi-audio-7b-instruct"


def test_a_value_that_could_be_misread_is_quoted_and_escaped():
    assert log_value("/v1/chat/completions") == "/v1/chat/completions"
    assert log_value("café") == "café"  # printable: as it is
    assert log_value("a b") == '"a b"' and log_value("") == '""' and log_value("k=v") == '"k=v"'
    for raw, written in [("x\ny", '"x\\ny"'), ("x\ry", '"x\\ry"'), ("x\x00y", '"x\\u0000y"')]:
        assert log_value(raw) == written
    for control in ["\x7f", "\x85", "\u2028", "\x1b"]:
        assert log_value(f"x{control}y").isprintable(), control
    assert key_values({"path": "/a\nb", "status": 404}) == 'path="/a\\nb" status=404'


@pytest.fixture(scope="module")
def long_question() -> bytes:
    """A minute of a tone: its encoding keeps the turn running while the client hangs up."""
    return wav_bytes((0.3 * np.sin(np.arange(60 * 16000) * 0.05)).astype(np.float32), 16000)


async def lines_after(proc, start: int, *words: str, count: int = 1) -> list[str]:
    """The server's log lines from line `start` on holding every one of `words`, once there are
    `count` (the server writes a request's line once it has ended: it may trail the answer)."""

    async def found():
        lines = [line for line in proc.output_lines[start:] if all(word in line for word in words)]
        return lines if len(lines) >= count else None

    return await eventually(found, f"{count} log lines with {words}")


async def hang_up_once_the_turn_runs(http: aiohttp.ClientSession, request) -> None:
    """Run `request` (a coroutine of the openai client) until the server holds its turn, then
    drop the connection."""
    task = asyncio.ensure_future(request)

    async def turn_held():
        return (await (await http.get("/api/status")).json())["pipeline"]["turns"] >= 1

    await eventually(turn_held, "the request's turn in the pipeline", interval=0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("route", ["chat", "transcription"])
async def test_a_client_that_hangs_up_is_logged_as_499_and_counted_as_no_error(
    route, v1_serve, long_question, openai_client
):
    proc, base = v1_serve
    instance = f"{socket.gethostname()}:{yarl.URL(base).port}"
    if route == "chat":
        path, kind = "/v1/chat/completions", "generation_failed"
        audio = {"data": base64.b64encode(long_question).decode(), "format": "wav"}
        request = openai_client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": audio}]}],
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "wav"},
            max_tokens=400,
        )
    else:
        path, kind = "/v1/audio/transcriptions", "transcription_failed"
        request = openai_client.audio.transcriptions.create(model=MODEL, file=("long.wav", long_question))
    async with aiohttp.ClientSession(base) as http:
        before = await scrape(http, instance)
        start = len(proc.output_lines)
        await hang_up_once_the_turn_runs(http, request)
        [line] = await lines_after(proc, start, "kimiaudio.requests", f"POST {path} ")
        assert " INFO " in line and f"request POST {path} status=499 cancelled=client_closed audio_in_s=60" in line
        assert "done_s=" in line
        after = await scrape(http, instance)
    errors = {key: value for key, value in after.items() if key.startswith("kimiaudio_errors_total")}
    assert errors == {key: value for key, value in before.items() if key.startswith("kimiaudio_errors_total")}
    assert not any(kind in key or "client_closed" in key for key in errors), errors
    assert f"kimiaudio_errors_total{{kind={kind},source=http}}" not in after


async def test_control_characters_in_a_path_stay_on_its_one_log_line(v1_serve):
    proc, base = v1_serve
    start = len(proc.output_lines)
    forged = "1999-12-31%2023:59:59,000%20ERROR%20kimiaudio.fake:%20forged%20line"
    async with aiohttp.ClientSession() as http:
        for path in (f"/v1/models/x%0a{forged}", "/v1/nothing%0d%0aINJECTED", "/v1/models/nul%00byte"):
            async with http.get(yarl.URL(base + path, encoded=True)) as resp:
                assert resp.status == 404 and (await resp.json())["error"]["type"] == "invalid_request_error"
    await lines_after(proc, start, "kimiaudio.requests", "request GET ", count=3)
    written = "".join(proc.output_lines[start:])
    assert '"/v1/models/x\\n1999-12-31 23:59:59,000 ERROR kimiaudio.fake: forged line" status=404' in written
    assert '"/v1/nothing\\r\\nINJECTED" status=404' in written and '"/v1/models/nul\\u0000byte" status=404' in written
    assert not any(line.startswith(("1999-12-31", "INJECTED")) for line in proc.output_lines[start:]), written
    assert "\x00" not in written and "\r" not in written
