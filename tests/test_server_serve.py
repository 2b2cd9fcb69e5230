"""`python -m kimiaudio serve` as a user runs it: the demo checkpoint is created, the URL and
the demo-weights notice are printed, the API answers, Ctrl-C stops it cleanly; a busy port
is a one-line error."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(data_dir: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "kimiaudio", "serve", "--data-dir", str(data_dir), "--port", str(port)],
        cwd=data_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_serve_prints_url_and_demo_notice_and_stops_on_ctrl_c(tmp_path):
    port = _free_port()
    proc = _serve(tmp_path, port)
    lines = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Press Ctrl-C" in line:
                break
        output = "".join(lines)
        assert f"http://127.0.0.1:{port}/" in output, output
        assert "DEMO WEIGHTS" in output and "--model DIR" in output, output
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10) as resp:
            status = json.load(resp)
        assert status["demo_weights"] is True and status["pipeline"]["running"] == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
            assert b"kimiaudio" in resp.read()

        # A second server on the same port: a clear one-line error, not a traceback.
        busy = subprocess.run(
            [sys.executable, "-m", "kimiaudio", "serve", "--data-dir", str(tmp_path), "--port", str(port)],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
        assert busy.returncode != 0 and "--port" in busy.stderr and "Traceback" not in busy.stderr, busy.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest and "stopped" in rest
    assert (tmp_path / "kimiaudio.db").exists()
