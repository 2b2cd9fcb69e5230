"""Whether an op runs its Triton kernel or its torch reference.

Triton ships with CUDA builds of torch; CPU builds (CI) have none. So no module imports
triton at the top except the kernel files, and those are imported only once a kernel is
chosen. `KIMIAUDIO_KERNELS` picks, read once per process:
- "auto" (default): Triton for CUDA tensors when triton imports, torch otherwise;
- "torch": never Triton (the reference path, e.g. to compare on a GPU);
- "triton": always, CPU tensors included: with TRITON_INTERPRET=1 the kernels then run in
  Triton's interpreter on the CPU, which is how their tests run without a GPU.
"""

from __future__ import annotations

import functools
import os

import torch

MODES = ("auto", "torch", "triton")


@functools.cache
def kernel_mode() -> str:
    mode = os.environ.get("KIMIAUDIO_KERNELS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"KIMIAUDIO_KERNELS={mode!r}: expected one of {', '.join(MODES)}")
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
    if mode == "triton":
        return True
    return device.type == "cuda" and triton_importable()
