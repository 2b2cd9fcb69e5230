""".ci/gpu-check's own logic, without a GPU: the plan it prints (steps in priority order, chosen
on the command line, one deadline), its preflight (no CUDA here: one line, nothing run), steps
left out for lack of time, and a step run, its report written as it ends (the smoke step, a
real `serve` on the CPU: GPU_CHECK_DEVICE=cpu skips the CUDA preflight for this test). The
deadline's arithmetic is checked with steps that cannot fit, not with timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kimiaudio.config import load_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "gpu-check"
STEPS = [
    "smoke",
    "7b",
    "full",
    "capped",
    "tests",
    "poisson",
    "trace",
    "estimates",
    "int8-capped",
    "bf16-capped",
    "7b-int8",
    "demo",
    "voice",
    "full-detok4",
]


def gpu_check(*args: str, out: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHON": sys.executable, **env}
    if out is not None:
        environ["OUT"] = str(out)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=environ, timeout=600)


def test_the_plan_lists_the_steps_in_priority_order_under_one_deadline():
    plan = gpu_check("--dry-run")
    assert plan.returncode == 0, plan.stderr
    lines = plan.stdout.splitlines()
    assert lines[0].startswith("deadline 540s")
    assert [line.split()[0] for line in lines[1:]] == STEPS
    assert "gpu_smoke.py" in lines[1] and "--weights fp8 --card-gib 24 --sessions 8" in lines[4]
    assert lines[-1].rstrip().endswith("--config .ci/gpu-detok4.toml")  # (a file the step needs, committed)
    experiment = load_config(ROOT / ".ci/gpu-detok4.toml")
    assert experiment.detok.max_batch_sessions == 4
    assert experiment.data_dir == ROOT / "data"  # the ignored data dir, not a new one under .ci/
    chosen = gpu_check("--dry-run", "--deadline", "300", "capped", "smoke")
    assert chosen.stdout.splitlines()[0].startswith("deadline 300s")
    assert [line.split()[0] for line in chosen.stdout.splitlines()[1:]] == ["capped", "smoke"]
    assert gpu_check("--dry-run", "smoke", GPU_CHECK_DEADLINE="120").stdout.startswith("deadline 120s")
    # The tests step runs every GPU test, or those GPU_CHECK_TESTS names (a rerun of the failed).
    tests = gpu_check("--dry-run", "tests").stdout
    assert tests.rstrip().endswith("tests/test_gpu*.py tests/test_triton_*.py --ignore=tests/test_triton_compile.py")
    some = "tests/test_gpu.py::test_pipeline_turn_on_device tests/test_triton_layers.py"
    assert gpu_check("--dry-run", "tests", GPU_CHECK_TESTS=some).stdout.rstrip().endswith(f"cacheprovider {some}")


def test_bad_arguments_are_one_line_and_run_nothing(tmp_path):
    for args, says in (
        (["nope"], "unknown step nope (steps: smoke 7b full"),
        (["--deadline", "5"], "--deadline 5: expected a whole number of seconds, at least 30"),
        (["--fast"], "unknown option --fast"),
    ):
        done = gpu_check(*args, out=tmp_path / "out")
        assert done.returncode == 2 and says in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_the_preflight_says_so_once(tmp_path):
    done = gpu_check(out=tmp_path)
    assert done.returncode == 1
    summary = (tmp_path / "summary.txt").read_text()
    assert f"preflight: {sys.executable} torch sees no CUDA GPU here; these are GPU checks" in summary
    assert (tmp_path / "steps.jsonl").read_text() == ""


def test_steps_that_do_not_fit_the_deadline_are_named(tmp_path):
    done = gpu_check("--deadline", "30", out=tmp_path, GPU_CHECK_DEVICE="cpu")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    assert summary[-2] == "not run for lack of time (deadline 30s): " + " ".join(STEPS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs.txt", "steps.jsonl", "summary.txt"]


@pytest.mark.slow
def test_a_step_runs_and_reports_as_it_ends(tmp_path):
    """The smoke step through the script on the CPU: `serve` with the default configuration, a
    spoken Realtime WebSocket turn and a chat completion with audio, its record written as the
    step ends. (Steps left out for lack of time: the test above.)"""
    done = gpu_check("smoke", out=tmp_path, GPU_CHECK_DEVICE="cpu")
    summary = (tmp_path / "summary.txt").read_text()
    assert done.returncode == 0, summary + (tmp_path / "logs.txt").read_text()[-3000:]
    (record,) = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert record["step"] == "smoke" and record["rc"] == 0 and record["seconds"] <= record["limit"] <= 150
    report = record["report"]
    assert report["ok"] and report["device"] == "cpu"
    assert report["realtime"]["status"] in ("completed", "incomplete") and report["realtime"]["audio_seconds"] > 0
    assert "input_audio_buffer.speech_stopped" in report["realtime"]["event_types"]  # the server's VAD committed
    assert report["chat"]["http_status"] == 200 and report["chat"]["audio_bytes"] > 44
    assert any("memory plan for" in line for line in report["server_lines"])
    assert "smoke rc=0" in summary and "ok=True device=cpu" in summary and "every step ran" in summary
