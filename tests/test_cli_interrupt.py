"""Ctrl-C while a command starts: one line and exit status 130, whatever it was doing."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers.serve_process import ROOT

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


def test_ctrl_c_while_torch_loads_is_one_line_and_130(tmp_path):
    data = ["--data-dir", str(tmp_path / "data"), "--port", "1"]  # (never reached)
    result = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_AT_TORCH, "serve", *data],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert result.returncode == 130, result.stderr
    assert result.stderr.strip() == "kimiaudio: interrupted"
