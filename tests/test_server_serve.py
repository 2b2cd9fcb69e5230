"""`python -m kimiaudio serve` as a user runs it: the demo checkpoint is created, the URL and
the demo-weights notice are printed, the API answers, Ctrl-C stops it cleanly; a busy port
and a conversation file another server owns are one-line errors."""

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from helpers.serve_process import ROOT, SERVE_CONFIG, free_port, start_serve, stop_serve

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
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert busy.returncode != 0 and "--port" in busy.stderr and "Traceback" not in busy.stderr, busy.stderr

        # A second server on another port but the same SQLite file: refused before it loads the
        # model (it would void the first one's leases), naming the process that owns the file.
        other = subprocess.run(
            [sys.executable, "-m", "kimiaudio", "serve", "--data-dir", str(tmp_path), "--port", str(free_port())],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        errors = [line for line in other.stderr.splitlines() if "error" in line]
        assert other.returncode == 2 and len(errors) == 1, other.stderr
        assert f"kimiaudio.db: in use by another kimiaudio process (pid {proc.pid})" in errors[0], errors
        assert "Loading" not in other.stdout and "Creating" not in other.stdout, other.stdout
    finally:
        stop_serve(proc)
    rest = "".join(proc.output_lines)
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest and "stopped" in rest
    assert (tmp_path / "kimiaudio.db").exists()


def test_serve_with_int8_weights_answers_a_spoken_turn_and_refuses_fp8_on_the_cpu(tmp_path, speech_wav):
    import base64

    openai = pytest.importorskip("openai")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # fp8 needs a GPU with fp8 products: one line and a non-zero exit before anything listens.
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "kimiaudio",
            "serve",
            "--data-dir",
            str(tmp_path),
            "--device",
            "cpu",
            "--weights",
            "fp8",
            "--port",
            str(free_port()),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    last = refused.stderr.strip().splitlines()[-1]  # after the log's demo-weights notice
    assert refused.returncode == 2 and last.startswith("kimiaudio: error: model.weights = fp8 needs a CUDA GPU"), last
    assert "Traceback" not in refused.stderr, refused.stderr

    port = free_port()
    proc = start_serve(tmp_path, port, SERVE_CONFIG, extra_args=("--device", "cpu", "--weights", "int8"))
    try:
        assert "weights: LM int8, DiT int8" in "".join(proc.output_lines)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        audio = {"data": base64.b64encode(speech_wav.read_bytes()).decode(), "format": "wav"}
        completion = client.chat.completions.create(
            model="kimi-audio-7b-instruct",
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "pcm16"},
            messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": audio}]}],
            seed=3,
        )
        message = completion.choices[0].message
        client.close()
        pcm = base64.b64decode(message.audio.data)
        assert (
            len(pcm) > 2 * 0.5 * 24000
            and max(abs(int.from_bytes(pcm[i : i + 2], "little", signed=True)) for i in range(0, len(pcm), 2)) > 300
        )
    finally:
        stop_serve(proc)
    assert proc.returncode == 0 and "Traceback" not in "".join(proc.output_lines)
