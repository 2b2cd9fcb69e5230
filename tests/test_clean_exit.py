"""A process that served ends quietly: no "nanobind: leaked ..." lines from Triton at exit.

`bench` and `serve` freeze the objects alive once the models are loaded (gc.freeze, so that
the collector's full scans skip them: pipeline/model_stack.py's freeze_loaded_objects). A
frozen object is never collected, not even by the interpreter's last collection, so Triton's
own reference cycles (objects of its nanobind extension, made when it is imported, as a CUDA
model load does) outlived the interpreter and nanobind listed each of them, with every type
and function of the extension, at exit: about 30 lines of stderr after every run. The
process here does what they do: imports the Triton kernels, freezes, exits.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

KERNELS = "import kimiaudio.layers.triton_ops, kimiaudio.engine.triton_attention\n"


def stderr_of(code: str) -> str:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_a_frozen_process_exits_without_leak_warnings():
    # What a plain freeze does with this Triton: if nothing leaks, there is nothing to check.
    control = stderr_of(KERNELS + "import gc\ngc.collect()\ngc.freeze()\n")
    if "leaked" not in control:
        pytest.skip("this Triton leaves no reference cycles behind when frozen")
    stderr = stderr_of(
        KERNELS + "from kimiaudio.pipeline.model_stack import freeze_loaded_objects\nfreeze_loaded_objects()\n"
    )
    assert [line for line in stderr.splitlines() if "leaked" in line] == [], stderr
