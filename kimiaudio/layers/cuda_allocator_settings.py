"""The settings torch's CUDA caching allocator reads once, at its first allocation: set here
without importing torch, so that the command line can set them before anything (torch
included, seconds to import) is loaded."""

from __future__ import annotations

import os

ALLOC_CONF_NAMES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def prefer_expandable_segments() -> None:
    """Ask torch's CUDA allocator for expandable segments unless the user configured it.

    Call before the first CUDA allocation (the allocator reads its settings once). With fixed
    segments the allocator kept about 2 GB reserved beyond its allocated peak in a 24 GiB run
    (segments split between transient tensors of different sizes and stream pools), room the
    memory plan could only guess; an expandable segment grows and shrinks in 2 MiB pages, so
    what is reserved follows what is allocated and the KV pool gets the rest."""
    if not any(os.environ.get(name) for name in ALLOC_CONF_NAMES):
        os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
