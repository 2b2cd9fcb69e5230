"""Graceful shutdown of a real `python -m kimiaudio serve` (demo checkpoint) by SIGTERM while a
streamed /v1 chat completion speaks its answer, read with the official openai client: with a
grace long enough the answer is let finish (its finish_reason, the stream's normal end) while
new requests are refused (503 shutting_down); with no grace it is cut at once and the stream
ends with an `error` event (shutting_down), not a bare truncation. Either way the request has
its log line, not blamed on the client, and the process exits 0."""

import asyncio
import base64
import signal
import subprocess
from pathlib import Path

import pytest

from helpers.serve_process import free_port, start_serve
from helpers.waiting import eventually

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.slow]

MODEL = "kimi-audio-7b-instruct"
SPEECH = Path(__file__).parent / "data" / "speech_hello_16k.wav"
# Greedy text (temperature 0) and greedy audio (audio_top_k 1): the same answer on every run,
# its stream open once the question's speech is encoded (the first chunk), then about 7 s of
# speech, which the detokenizer makes no faster than it would be played (detok.run_ahead_s),
# past aiohttp's own 5 s shutdown timeout. The test waits on the stream's end, never on a clock.
QUESTION = [
    {"type": "text", "text": "Tell me a long story."},
    {"type": "input_audio", "input_audio": {"data": base64.b64encode(SPEECH.read_bytes()).decode(), "format": "wav"}},
]
CONFIG = "[server]\nshutdown_grace_s = {grace_s}\n[sampling]\naudio_top_k = 1\n[engine]\nnum_kv_blocks = 256\n"


def start_with_grace(tmp_path: Path, grace_s: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    return start_serve(tmp_path, port, CONFIG.format(grace_s=grace_s)), f"http://127.0.0.1:{port}/v1"


async def refused_once_draining(client) -> openai.APIError:
    """A new request's error once the server drains (it may still answer before the SIGTERM
    lands): its 503, or the connection refused if the server stopped listening."""

    async def refused():
        try:
            await client.models.list()
        except openai.APIError as exc:
            return exc
        return None

    return await eventually(refused, "a request refused after the SIGTERM")


async def stream_through_sigterm(proc: subprocess.Popen, client) -> tuple[list, Exception | None, object]:
    """Stream a long spoken answer and SIGTERM the server once its first chunk came; (the chunks,
    the error the stream raised or None, the error a request made while draining got or None)."""
    chunks: list = []
    late = None
    try:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": QUESTION}],
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "pcm16"},
            temperature=0,
            max_completion_tokens=1500,
            stream=True,
        )
        async for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == 1:
                proc.send_signal(signal.SIGTERM)
                late = asyncio.create_task(refused_once_draining(client))
    except openai.APIError as exc:
        if late is not None:  # the server may be gone before it is refused
            late.cancel()
        return chunks, exc, None
    return chunks, None, await late if late is not None else None


def request_lines(output: str) -> list[str]:
    """The status (and failure) of each /v1/chat/completions log line (observe/request_log.py)."""
    lines = [line.partition("/v1/chat/completions ")[2] for line in output.splitlines() if "request POST" in line]
    return [" ".join(field for field in line.split() if field.split("=")[0] in ("status", "failed")) for line in lines]


async def run_case(tmp_path: Path, grace_s: float):
    proc, base_url = start_with_grace(tmp_path, grace_s)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    try:
        chunks, error, late = await stream_through_sigterm(proc, client)
        code = await asyncio.to_thread(proc.wait, 120)
    finally:
        await client.close()
        if proc.poll() is None:
            proc.kill()
    return chunks, error, late, code, "".join(proc.output_lines)


async def test_a_streamed_answer_in_flight_at_sigterm_finishes_within_the_grace(tmp_path):
    chunks, error, late, code, output = await run_case(tmp_path, 120.0)
    assert error is None, (error, output)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(reasons) == 1, (reasons, output)  # the whole answer, not one cut
    assert (late.status_code, late.code) == (503, "shutting_down"), (late, output)
    assert code == 0, output
    assert request_lines(output) == ["status=200"], output
    assert "went away" not in output and "Traceback" not in output, output


async def test_a_streamed_answer_still_running_when_the_grace_ends_gets_an_error_event(tmp_path):
    chunks, error, _, code, output = await run_case(tmp_path, 0.0)
    assert chunks and not any(c.choices and c.choices[0].finish_reason for c in chunks), output
    # The official client raises an `error` event as APIError; a bare truncation would be its
    # APIConnectionError subclass.
    assert isinstance(error, openai.APIError) and not isinstance(error, openai.APIConnectionError), (error, output)
    assert error.code == "shutting_down", (error.body, output)
    assert code == 0, output
    assert request_lines(output) == ["status=200 failed=shutting_down"], output
    assert "went away" not in output and "Traceback" not in output, output
