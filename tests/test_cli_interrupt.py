"""Ctrl-C or SIGTERM while a command starts: exit status 130, one line, nothing half-written."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers.serve_process import ROOT, free_port

# `python -m kimiaudio ARGS` that sends itself SIGINT the moment it begins importing torch: a
# Ctrl-C pressed during the seconds that import takes, at no guessed time.
INTERRUPTED_AT_TORCH = """
import os, runpy, signal, sys

class InterruptAtTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
sys.meta_path.insert(0, InterruptAtTorch())
sys.argv = ["kimiaudio", *sys.argv[1:]]
runpy.run_module("kimiaudio", run_name="__main__", alter_sys=True)
"""


def run_serve(script: str, *args: str) -> subprocess.CompletedProcess:
    """`script` run as `python -c script serve ARGS` from the repository."""
    return subprocess.run(
        [sys.executable, "-c", script, "serve", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )


def test_ctrl_c_while_torch_loads_is_one_line_and_130(tmp_path):
    # (serve checks its address before torch is imported: a free port, so the start gets there)
    result = run_serve(INTERRUPTED_AT_TORCH, "--data-dir", str(tmp_path / "data"), "--port", str(free_port()))
    assert result.returncode == 130, result.stderr
    assert result.stderr.strip() == "kimiaudio: interrupted"


# `python -m kimiaudio serve ARGS` that is sent SIGTERM once it writes its first file of the
# demo checkpoint (into the directory beside its place), as `kill` or a service manager would.
TERMINATED_WRITING_THE_DEMO = """
import os, runpy, signal, sys

def terminate_once(event, args):
    if event == "open" and ".demo-checkpoint-" in str(args[0]) and not getattr(terminate_once, "done", False):
        terminate_once.done = True
        os.kill(os.getpid(), signal.SIGTERM)

sys.addaudithook(terminate_once)
sys.argv = ["kimiaudio", *sys.argv[1:]]
runpy.run_module("kimiaudio", run_name="__main__", alter_sys=True)
"""


def test_sigterm_while_the_demo_checkpoint_is_written_leaves_nothing_half_written(tmp_path):
    data = tmp_path / "data"
    result = run_serve(TERMINATED_WRITING_THE_DEMO, "--data-dir", str(data), "--port", str(free_port()))
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr
    assert not [p.name for p in data.iterdir() if "demo-checkpoint" in p.name]
