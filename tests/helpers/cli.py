"""Running `python -m kimiaudio ...` as a user does, and what a one-line CLI error looks like."""

from __future__ import annotations

import functools
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

from helpers.serve_process import ROOT


def kimiaudio(
    *args: str, cwd: Path | None = None, files_up_to: int | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m kimiaudio ARGS` (`env`: variables added to this process's); with
    `files_up_to`, under a file size limit of that many bytes: a write past it fails as on a full
    disk (EFBIG instead of ENOSPC)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "kimiaudio", *args],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        env=env,
        timeout=300,
        preexec_fn=None if files_up_to is None else functools.partial(_limit_files, files_up_to),
    )


def _limit_files(size: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (a write past the limit fails instead of killing)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
