"""`python -m kimiaudio serve` as a user runs it: the demo checkpoint is created, the URL and
the demo-weights notice are printed, the API answers, Ctrl-C stops it cleanly; a busy port
is a one-line error."""

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from test_server_support import ROOT, free_port, start_serve, stop_serve

pytestmark = pytest.mark.slow


def test_serve_prints_url_and_demo_notice_and_stops_on_ctrl_c(tmp_path):
    port = free_port()
    proc = start_serve(tmp_path, port)
    try:
        output = "".join(proc.output_lines)
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
        stop_serve(proc)
    rest = "".join(proc.output_lines)
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest and "stopped" in rest
    assert (tmp_path / "kimiaudio.db").exists()
