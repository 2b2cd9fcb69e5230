"""Bad input to the /v1 routes of a real `serve` process: every case is an OpenAI-shaped JSON
error ({"error": {"message", "type", "param", "code"}}) with a 4xx status, never a 500 or a
traceback. Raw HTTP (aiohttp), so that malformed bodies can be sent at all."""

import asyncio
import base64
import io
import json

import aiohttp
import numpy as np
import pytest
import soundfile
import yarl

from kimiaudio.audio.io import wav_bytes

from helpers.waiting import eventually

pytestmark = pytest.mark.slow
MODEL = "kimi-audio-7b-instruct"


def chat(part: dict, **body) -> dict:
    """A chat body whose one message holds the input_audio `part`."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": part}]}],
        **body,
    }


@pytest.fixture(scope="module")
def wav(speech_wav) -> str:
    return base64.b64encode(speech_wav.read_bytes()).decode()


def cases(wav: str):
    absurd_rate = bytearray(base64.b64decode(wav))
    absurd_rate[24:28] = (2**31 - 1).to_bytes(4, "little")  # the WAV header's sample rate
    absurd_rate = base64.b64encode(absurd_rate).decode()
    silent = base64.b64encode(wav_bytes(np.zeros(16000, np.float32), 16000)).decode()
    noise = np.random.default_rng(0).uniform(-0.1, 0.1, 121 * 8000).astype(np.float32)
    too_long = base64.b64encode(wav_bytes(noise, 8000)).decode()
    loud = io.BytesIO()  # float samples far past full scale: no feature can be computed from them
    soundfile.write(loud, np.tile(np.float32([1e30, -1e30]), 8000), 16000, subtype="FLOAT", format="WAV")
    loud = base64.b64encode(loud.getvalue()).decode()
    ok = {"data": wav, "format": "wav"}
    yield "chat/completions", b"{not json", 400, "invalid_json", None
    yield "chat/completions", b'{"a": ' * 100 + b"1" + b"}" * 100, 400, "invalid_json", None
    yield "chat/completions", chat(ok, model="gpt-4-turbo"), 404, "model_not_found", "model"
    yield (
        "chat/completions",
        chat({"data": "@@@", "format": "wav"}),
        400,
        "invalid_base64",
        "messages[0].content[0].input_audio.data",
    )
    yield (
        "chat/completions",
        chat({"data": base64.b64encode(b"RIFF junk").decode(), "format": "wav"}),
        400,
        "invalid_audio",
        "messages[0].content[0].input_audio.data",
    )
    yield (
        "chat/completions",
        chat({"data": silent, "format": "wav"}),
        400,
        "invalid_audio",
        "messages[0].content[0].input_audio.data",
    )
    yield (
        "chat/completions",
        chat({"data": too_long, "format": "wav"}),
        400,
        "invalid_audio",
        "messages[0].content[0].input_audio.data",
    )
    yield (
        "chat/completions",
        chat({"data": loud, "format": "wav"}),
        400,
        "invalid_audio",
        "messages[0].content[0].input_audio.data",
    )
    yield (
        "chat/completions",
        chat({"data": wav, "format": "midi"}),
        400,
        "unsupported_format",
        "messages[0].content[0].input_audio.format",
    )
    yield (
        "chat/completions",
        chat(ok, modalities=["text", "audio"], audio={"voice": "x", "format": "ogg_vorbis"}),
        400,
        "unsupported_format",
        "audio.format",
    )
    yield (
        "chat/completions",
        chat({"data": absurd_rate, "format": "wav"}),
        400,
        "invalid_audio",
        "messages[0].content[0].input_audio.data",
    )
    yield (
        "chat/completions",
        chat(ok, modalities=["text", "audio"], audio={"voice": "x", "format": ["wav"]}),
        400,
        "unsupported_format",
        "audio.format",
    )
    yield (
        "chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "assistant", "content": [{"type": "text", "text": 5}]}, *chat(ok)["messages"]],
        },
        400,
        "invalid_value",
        "messages[0].content[0]",
    )
    yield (  # an assistant's parts are text (or refusals), each of them
        "chat/completions",
        {
            "model": MODEL,
            "messages": [
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}, {"type": "image_url"}]},
                *chat(ok)["messages"],
            ],
        },
        400,
        "invalid_value",
        "messages[0].content[1]",
    )
    yield (
        "chat/completions",
        {"model": MODEL, "messages": [{"role": "assistant", "content": [[[]], 5]}, *chat(ok)["messages"]]},
        400,
        "invalid_value",
        "messages[0].content[0]",
    )
    yield "chat/completions", chat(ok, stream_options={"include_usage": True}), 400, "invalid_value", "stream_options"
    yield (
        "chat/completions",
        chat(ok, stream=True, stream_options={"include_usage": "yes"}),
        400,
        "invalid_value",
        "stream_options.include_usage",
    )
    yield (
        "chat/completions",
        chat(ok, stream=True, stream_options={"include_usage": True, "bogus": 1}),
        400,
        "unknown_parameter",
        "stream_options.bogus",
    )
    yield (
        "chat/completions",
        chat(ok, modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav", "speed": 2}),
        400,
        "unknown_parameter",
        "audio.speed",
    )
    yield "chat/completions", chat(ok, modalities=["video"]), 400, "invalid_value", "modalities"
    yield "chat/completions", chat(ok, modalities=["text", "audio"]), 400, "missing_required_parameter", "audio"
    yield "chat/completions", chat(ok, max_tokens="many"), 400, "invalid_value", "max_tokens"
    yield (
        "chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]},
        400,
        "invalid_value",
        "messages[1].role",
    )
    yield (
        "chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": ""}]},
        400,
        "invalid_value",
        "messages[1].content",
    )
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    for content in (None, "Calling f."):  # a call is refused, not dropped beside the text
        yield (
            "chat/completions",
            {
                "model": MODEL,
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": content, "tool_calls": [call]},
                    {"role": "user", "content": "Go on"},
                ],
            },
            400,
            "unsupported_content",
            "messages[1].tool_calls",
        )
    yield (
        "chat/completions",
        {"model": MODEL, "messages": [{"role": "tool", "content": "x"}]},
        400,
        "invalid_value",
        "messages[0].role",
    )
    yield "chat/completions", b"x" * (35 * 1024 * 1024), 413, "too_large", None
    yield "audio/transcriptions", b'{"model": "x"}', 415, "unsupported_media_type", None
    yield "nothing/here", b"{}", 404, "unknown_url", None


async def test_bad_input_gets_openai_shaped_4xx_errors(v1_server, wav):
    async with aiohttp.ClientSession() as http:
        for path, body, status, code, param in cases(wav):
            kwargs = (
                {"data": body, "headers": {"Content-Type": "application/json"}}
                if isinstance(body, bytes)
                else {"json": body}
            )
            async with http.post(f"{v1_server}/v1/{path}", **kwargs) as resp:
                text = await resp.text()
                assert resp.status == status, (path, code, resp.status, text[:300])
                error = (await resp.json())["error"]
                assert (error["code"], error["param"]) == (code, param), (path, error)
                assert error["type"] == "invalid_request_error" and error["message"], error
                assert "Traceback" not in text


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("path", ["chat/completions", "audio/transcriptions", "realtime/client_secrets"])
async def test_a_body_not_in_its_content_encoding_is_a_400(v1_serve, path, encoding):
    """A 400 that leaves no traceback in the log: the connection closes after the answer (the rest
    of the body cannot be read), so the server's log is complete once the client sees it close."""
    proc, base = v1_serve
    kind = "multipart/form-data; boundary=b" if path == "audio/transcriptions" else "application/json"
    body = b"not compressed"
    start = len(proc.output_lines)
    url = yarl.URL(base)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    writer.write(
        f"POST /v1/{path} HTTP/1.1\r\nHost: {url.authority}\r\nContent-Type: {kind}\r\n"
        f"Content-Encoding: {encoding}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    answer = await reader.read()  # until the server closes the connection
    writer.close()
    head, _, text = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer[:300]
    error = json.loads(text)["error"]
    assert error["code"] == "invalid_body" and encoding in error["message"], error
    async with aiohttp.ClientSession() as http:  # a request logged after everything the first one logged
        async with http.get(f"{base}/v1/models/after-the-bad-body") as resp:
            assert resp.status == 404

    async def marker_logged():
        return any("after-the-bad-body" in line for line in proc.output_lines[start:])

    await eventually(marker_logged, "the later request's log line")
    logged = "".join(proc.output_lines[start:])
    assert "Traceback" not in logged and "Unhandled exception" not in logged, logged
