"""Whether an op runs its Triton kernel or its torch reference.

Triton ships with CUDA builds of torch; CPU builds (CI) have none. So no module imports
triton at the top except the kernel files, and those are imported only once a kernel is
chosen. `KIMIAUDIO_KERNELS` picks, read once per process:
- "auto" (default): Triton for CUDA tensors when triton imports, torch otherwise (the CPU's
  path is always torch's, TRITON_INTERPRET or not);
- "torch": never Triton (the reference path, e.g. to compare on a GPU);
- "triton": always on CUDA; on CPU tensors only in Triton's interpreter (TRITON_INTERPRET=1),
  which is how the kernels' tests run without a GPU: there is no compiled kernel for a CPU.
"""

from __future__ import annotations

import functools
import os

import torch

from kimiaudio.errors import ConfigError

MODES = ("auto", "torch", "triton")


@functools.cache
def kernel_mode() -> str:
    mode = os.environ.get("KIMIAUDIO_KERNELS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ConfigError(f"KIMIAUDIO_KERNELS={mode!r}: expected one of {', '.join(MODES)}")
    return mode


@functools.cache
def triton_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(device: torch.device) -> bool:
    """Run the Triton kernel for tensors on `device`?"""
    mode = kernel_mode()
    if mode == "torch":
        return False
    if device.type == "cuda":
        return mode == "triton" or triton_importable()
    if mode == "triton":
        if not interpreting() or not triton_importable():
            raise ConfigError(
                f"KIMIAUDIO_KERNELS=triton for {device.type} tensors needs triton installed and "
                "TRITON_INTERPRET=1 (its interpreter: compiled kernels need a CUDA GPU)"
            )
        return True
    return False  # auto: the CPU's path is torch's, even where the interpreter is on
