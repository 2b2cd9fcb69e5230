"""Shared helpers for the server tests (no tests here): the sentences of the `speech` fixture,
WAV writing, and the server with the real pipeline on the demo checkpoint. The WebRTC test
client is package code (kimiaudio.bench.loopback_client, also used by bench --webrtc).
Imported by tests/test_server_*.py and tests/test_browser_*.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from kimiaudio.audio.io import write_wav
from kimiaudio.config import Config
from kimiaudio.engine.engine_io import BACKGROUND_PRIORITY
from kimiaudio.pipeline.pipeline import Pipeline

SENTENCES = [
    "Hello, what is the weather like today?",
    "Please stop and listen to me.",
]


def silence(seconds: float, sr: int = 16000) -> np.ndarray:
    return np.zeros(int(seconds * sr), dtype=np.float32)


def write_clip(path: Path, pieces: list[np.ndarray], sr: int = 16000) -> Path:
    write_wav(path, np.concatenate(pieces), sr)
    return path


# ------------------------------------------------------------- the real server on the demo checkpoint


DEMO_MAX_NEW_TOKENS = 60  # about 2 s of (noise) speech from the demo weights
# Sampling for a long answer from the demo weights: with greedy audio, most answers run for
# 4-10 s (up to 400 positions), generated in a second or two and played in real time; but
# some still stop within a second, depending on the captured user audio (under load the
# WebRTC input drops frames, so it differs more). Tests that need a response still in progress
# also set RecordingPipeline.answers_to_limit (see long_answer_playing in test_server_rtc.py).
LONG_ANSWER = {"audio_top_k": 1, "max_new_tokens": 400}


def demo_config(checkpoint: Path, data_dir: Path, **server) -> Config:
    config = Config()
    config.model.path = str(checkpoint)
    config.model.device = "cpu"
    config.storage.data_dir = str(data_dir)
    config.engine.num_kv_blocks = 256
    config.sampling.max_new_tokens = DEMO_MAX_NEW_TOKENS
    config.vad.silence_ms = 400
    for key, value in server.items():
        setattr(config.server, key, value)
    return config


@functools.cache
def demo_stack(checkpoint: Path):
    """The model stack of the demo checkpoint, loaded once per test session (it is only read)."""
    from kimiaudio.pipeline.model_stack import ModelStack

    return ModelStack.load(demo_config(checkpoint, checkpoint.parent / "unused"))


class RecordingPipeline(Pipeline):
    """The real pipeline, also keeping what the server asked of it: the answers' turn requests
    and their handles, the transcriptions' (background priority) apart, and the turn ids it
    was told to cancel."""

    def __init__(self, stack, config):
        super().__init__(stack, config)
        self.requests, self.handles, self.cancelled = [], [], []
        self.transcriptions = []  # (request, handle) of each user turn transcribed
        # Answers ignore the end of message and run to their max_new_tokens: a test that must
        # interrupt an answer in progress gets a long one whatever the random weights say.
        self.answers_to_limit = False

    def submit(self, request):
        if self.answers_to_limit and request.priority != BACKGROUND_PRIORITY:
            request = dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, ignore_eos=True))
        handle = super().submit(request)
        if request.priority == BACKGROUND_PRIORITY:
            self.transcriptions.append((request, handle))
        else:
            self.requests.append(request)
            self.handles.append(handle)
        return handle

    def cancel(self, handle):
        self.cancelled.append(handle.turn_id)
        super().cancel(handle)


@contextlib.asynccontextmanager
async def demo_server(aiohttp_client, checkpoint: Path, data_dir: Path, storage_url: str = "", **server):
    """(test client, pipeline): the server app with a real pipeline on the demo checkpoint (its
    conversations in a SQLite file under `data_dir`, or the PostgreSQL database `storage_url`)."""
    from kimiaudio.server.app import create_app

    config = demo_config(checkpoint, data_dir, **server)
    config.storage.url = storage_url
    stack = demo_stack(checkpoint)
    pipeline = RecordingPipeline(stack, config)
    await pipeline.start()
    try:
        http = await aiohttp_client(create_app(config, stack, pipeline))
        yield http, pipeline
        await http.close()
    finally:
        await pipeline.stop()


async def kv_pool_full_again(pipeline) -> dict:
    """Wait until no turn runs and every KV block is free again."""

    async def settled():
        stats = pipeline.stats()
        idle = stats["kv_blocks_free"] == stats["kv_blocks_total"] and stats["running"] == 0 and stats["turns"] == 0
        return stats if idle else None

    try:
        return await eventually(settled, "KV pool released")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {pipeline.stats()}") from None


async def heard_or_done(client, http, conversation_id: str, attempt: int, codes: int) -> bool:
    """Wait until the answer to user turn `attempt` (1-based) has `codes` audio codes stored as
    heard (the server stores a playing answer's heard part, and the codes of it, every second)
    -> True; or its response.done came first -> False. Not a wall-clock wait: on a loaded
    machine the answer may play behind time, and what was heard is read back from the store."""
    index = 2 * attempt - 1

    async def check():
        if len(client.of_type("response.done")) >= attempt:
            return "done"
        turns = (await (await http.get(f"/api/conversations/{conversation_id}")).json())["turns"]
        return "heard" if len(turns) > index and len(turns[index]["audio_tokens"] or []) >= codes else None

    return await eventually(check, f"answer {attempt} heard for {codes} codes, or done", interval=0.1) == "heard"


# ------------------------------------------------------------- a real `serve` process

ROOT = Path(__file__).resolve().parent.parent
# The serve process's settings for the HTTP API tests: short demo answers, a small KV pool.
SERVE_CONFIG = f"""
[sampling]
max_new_tokens = {DEMO_MAX_NEW_TOKENS}
[engine]
num_kv_blocks = 256
[vad]
silence_ms = 400
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(
    data_dir: Path, port: int, config_text: str | None = None, env: dict[str, str] | None = None, extra_args: tuple = ()
) -> subprocess.Popen:
    """`python -m kimiaudio serve` on 127.0.0.1:`port` (with a config file holding `config_text`,
    `env` added to its environment, and `extra_args`); returns once it listens. Its output is
    drained in a thread, kept in `proc.output_lines`."""
    args = [sys.executable, "-m", "kimiaudio", "serve", "--data-dir", str(data_dir), "--port", str(port), *extra_args]
    if config_text is not None:
        (data_dir / "config.toml").write_text(config_text)
        args += ["--config", str(data_dir / "config.toml")]
    extra = env or {}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("KIMIAUDIO_API_KEY", None)  # the tests' servers need no key unless their config says so
    env.update(extra)
    proc = subprocess.Popen(args, cwd=data_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc.output_lines = []
    ready = threading.Event()

    def drain():
        for line in proc.stdout:
            proc.output_lines.append(line)
            if "Press Ctrl-C" in line:
                ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(120):
        proc.kill()
        raise AssertionError("server did not start:\n" + "".join(proc.output_lines))
    return proc


def stop_serve(proc: subprocess.Popen) -> None:
    import signal

    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


# ------------------------------------------------------------- hostile clients

# What an error message must never show: internal exception names or a traceback.
INTERNAL_NAMES = re.compile(r"Traceback|\b[A-Za-z]*(Error|Exception)\b")


async def offer_sdp() -> str:
    """A real offer from an aiortc peer (microphone track + data channel), as a browser sends."""
    from aiortc import RTCPeerConnection

    from kimiaudio.bench.loopback_client import ScriptedMic

    pc = RTCPeerConnection()
    pc.createDataChannel("events")
    pc.addTrack(ScriptedMic())
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


async def raw_request(
    port: int, head: str, body: bytes = b"", pause_s: float = 0.0, send_rest: bool = True, read_timeout: float = 30.0
) -> tuple[int, bytes]:
    """Send `head` (request line and headers) and `body` over a plain socket; with `pause_s`, the
    body's first half, a pause, then its second half; with `send_rest=False`, only the first
    half. -> (status, response body); status 0 if the server closed without an answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        cut = len(body) // 2 if pause_s or not send_rest else len(body)
        writer.write(f"{head}\r\n\r\n".encode("latin-1") + body[:cut])
        await writer.drain()
        if send_rest and pause_s:
            await asyncio.sleep(pause_s)
            writer.write(body[cut:])
            await writer.drain()
        head_bytes = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), read_timeout)
        length = int(re.search(rb"(?i)content-length: *(\d+)", head_bytes).group(1))
        content = await asyncio.wait_for(reader.readexactly(length), read_timeout)
    except asyncio.IncompleteReadError:
        return 0, b""
    finally:
        writer.close()
    return int(head_bytes.split()[1]), content


def post_head(port: int, path: str, length: int, content_type: str = "application/json", **headers: str) -> str:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        f"Content-Type: {content_type}",
        f"Content-Length: {length}",
        "Connection: close",
        *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items()),
    ]
    return "\r\n".join(lines)


def route_templates(app) -> list[tuple[str, str]]:
    """(method, path template) of every route of the app, static files excepted; a catch-all
    route ("*", e.g. /v1's OpenAI-shaped 404) is listed under each real method."""
    found = []
    for resource in app.router.resources():
        info = resource.get_info()
        if "directory" in info:
            continue
        template = info.get("formatter") or info.get("path")
        for route in resource:
            methods = ("GET", "POST", "DELETE") if route.method == "*" else (route.method,)
            found += [(method, template) for method in methods if method != "HEAD"]
    return found


def fill_template(template: str, **values: str) -> str:
    """A route template with each {name} replaced (values given, else "0")."""
    return re.sub(r"{(\w+)}", lambda m: str(values.get(m.group(1), "0")), template)


async def eventually(check, what: str, timeout: float = 120.0, interval: float = 0.05):
    """Await `check()` until it returns something truthy, and return that; an AssertionError
    naming `what` after `timeout` s. The limit catches a hang, not slowness: on a loaded 2-core
    machine what takes a tenth of a second alone can take many seconds."""
    try:
        async with asyncio.timeout(timeout):
            while not (result := await check()):
                await asyncio.sleep(interval)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {timeout:.0f} s") from None
    return result
