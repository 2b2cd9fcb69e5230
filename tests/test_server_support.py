"""Shared helpers for the server tests (no tests here): the sentences of the `speech` fixture,
WAV writing, and the server with the real pipeline on the demo checkpoint. The WebRTC test
client is package code (kimiaudio.bench.loopback_client, also used by bench --webrtc).
Imported by tests/test_server_*.py and tests/test_browser_*.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kimiaudio.audio.io import write_wav

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
import asyncio
import contextlib
import functools

from kimiaudio.config import Config
from kimiaudio.pipeline.pipeline import Pipeline

DEMO_MAX_NEW_TOKENS = 60  # about 2 s of (noise) speech from the demo weights
# Sampling for a long answer from the demo weights: with greedy audio, most answers run for
# 4-10 s (up to 400 positions), generated in a second or two and played in real time; but
# some still stop within a second, depending on the captured user audio. For tests that need
# a response still in progress (see long_answer_playing in test_server_rtc.py).
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


@functools.lru_cache(maxsize=None)
def demo_stack(checkpoint: Path):
    """The model stack of the demo checkpoint, loaded once per test session (it is only read)."""
    from kimiaudio.pipeline.model_stack import ModelStack

    return ModelStack.load(demo_config(checkpoint, checkpoint.parent / "unused"))


class RecordingPipeline(Pipeline):
    """The real pipeline, also keeping what the server asked of it: the turn requests and
    their handles, and the turn ids it was told to cancel."""

    def __init__(self, stack, config):
        super().__init__(stack, config)
        self.requests, self.handles, self.cancelled = [], [], []

    def submit(self, request):
        handle = super().submit(request)
        self.requests.append(request)
        self.handles.append(handle)
        return handle

    def cancel(self, handle):
        self.cancelled.append(handle.turn_id)
        super().cancel(handle)


@contextlib.asynccontextmanager
async def demo_server(aiohttp_client, checkpoint: Path, data_dir: Path, **server):
    """(test client, pipeline): the server app with a real pipeline on the demo checkpoint."""
    from kimiaudio.server.app import create_app

    config = demo_config(checkpoint, data_dir, **server)
    stack = demo_stack(checkpoint)
    pipeline = RecordingPipeline(stack, config)
    await pipeline.start()
    try:
        http = await aiohttp_client(create_app(config, stack, pipeline))
        yield http, pipeline
        await http.close()
    finally:
        await pipeline.stop()


async def kv_pool_full_again(pipeline, timeout: float = 5.0) -> dict:
    """Wait until no turn runs and every KV block is free again."""
    stats = pipeline.stats()
    for _ in range(int(timeout / 0.05)):
        stats = pipeline.stats()
        if stats["kv_blocks_free"] == stats["kv_blocks_total"] and stats["running"] == 0 and stats["turns"] == 0:
            return stats
        await asyncio.sleep(0.05)
    raise AssertionError(f"KV pool not released: {stats}")


# ------------------------------------------------------------- a real `serve` process
import os
import socket
import subprocess
import sys
import threading

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


def start_serve(data_dir: Path, port: int, config_text: str | None = None) -> subprocess.Popen:
    """`python -m kimiaudio serve` on 127.0.0.1:`port` (with a config file holding `config_text`);
    returns once it listens. Its output is drained in a thread, kept in `proc.output_lines`."""
    args = [sys.executable, "-m", "kimiaudio", "serve", "--data-dir", str(data_dir), "--port", str(port)]
    if config_text is not None:
        (data_dir / "config.toml").write_text(config_text)
        args += ["--config", str(data_dir / "config.toml")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
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
