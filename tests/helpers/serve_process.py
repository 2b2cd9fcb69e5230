"""A real `python -m kimiaudio serve` process for the tests that need one: started on a free
port, its output kept, stopped with SIGINT."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from helpers.demo_server import DEMO_MAX_NEW_TOKENS

ROOT = Path(__file__).resolve().parents[2]  # the repository


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
