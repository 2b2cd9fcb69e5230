"""How much of a CUDA device this process may use: the card, or less under a per-process cap.

`torch.cuda.set_per_process_memory_fraction` caps what this process's caching allocator may
reserve (the card's total times the fraction), while the driver's free-memory figure still
counts the whole card; a KV pool or a memory plan sized from the driver alone would reach past
the cap and fail its allocation. A cap is how one GPU is shared by two instances, and how
`bench --card-gib 24` runs the pipeline on a larger card as if it had 24 GiB. On the CPU, what
the machine has available bounds a KV pool of a fixed size (`host_available_bytes`).
"""

from __future__ import annotations

import os

import torch

from kimiaudio.errors import ConfigError

GIB = 1 << 30


def indexed(device: torch.device) -> torch.device:
    """`device` itself when it names one CUDA device; ValueError otherwise (the resolved
    model.device always does: checkpoint/paths.py resolve_device)."""
    if device.type != "cuda" or device.index is None:
        raise ValueError(f"{device}: expected an indexed CUDA device such as cuda:0")
    return device


def _fraction(device: torch.device) -> float:
    # get_per_process_memory_fraction is newer than some torch builds the project meets.
    get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    return 1.0 if get is None else float(get(device))


def capacity_bytes(device: torch.device) -> int:
    """The bytes this process may hold on `device` in all: the card's, or its cap."""
    device = indexed(device)
    total = torch.cuda.mem_get_info(device)[1]
    return int(total * _fraction(device))


def free_bytes(device: torch.device) -> int:
    """The bytes this process can still allocate on `device` beyond what it has reserved."""
    device = indexed(device)
    free, total = torch.cuda.mem_get_info(device)
    fraction = _fraction(device)
    if fraction < 1.0:
        free = min(free, int(total * fraction) - torch.cuda.memory_reserved(device))
    return max(0, free)


def cap_process(device: torch.device, gib: float, what: str = "--card-gib") -> None:
    """Let this process use at most `gib` GiB of `device`, as on a card of that size."""
    device = indexed(device)
    total = torch.cuda.mem_get_info(device)[1]
    if not 0 < gib * GIB <= total:
        raise ConfigError(f"{what} {gib:g}: expected more than 0 and at most this GPU's {total / GIB:.1f} GiB")
    torch.cuda.set_per_process_memory_fraction(gib * GIB / total, device)


def peak_memory(device: torch.device) -> dict:
    """The most this process's allocator held on `device` so far, for a bench report, and
    whether its segments are expandable (prefer_expandable_segments asked; the allocator
    decides, and says so per segment)."""
    segments = [s for s in torch.cuda.memory_snapshot() if s.get("device") == device.index]
    return {
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
        "expandable_segments": any(s.get("is_expandable", False) for s in segments),
    }


def host_available_bytes() -> int | None:
    """The memory this machine can still give the process, as the kernel estimates it
    (/proc/meminfo's MemAvailable; the free pages elsewhere), or None if it does not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
