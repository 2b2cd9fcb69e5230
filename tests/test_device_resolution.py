"""model.device resolved once to an indexed device (checkpoint/paths.py resolve_device), on a
machine made to look like one with CUDA: torch's own index check stands in for the driver's
calls that refuse an index-less device (torch.cuda.get_per_process_memory_fraction did)."""

from __future__ import annotations

import os

import pytest
import torch
from torch.cuda._utils import _get_device_index

from kimiaudio.checkpoint.paths import resolve_device
from kimiaudio.errors import CheckpointError
from kimiaudio.layers.device_memory import GIB, capacity_bytes, free_bytes


@pytest.fixture
def two_gpus(monkeypatch):
    """torch.cuda as on a machine with two 80 GiB GPUs whose current device is the second;
    the memory calls take an indexed device only, as the real ones (some of them) do."""

    def memory(device=None):
        _get_device_index(device, optional=False)  # ValueError for an index-less device
        return 70 * GIB, 80 * GIB

    def fraction(device=None):
        _get_device_index(device, optional=False)
        return 1.0

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", memory)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", fraction)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)


def test_auto_and_cuda_resolve_to_the_current_indexed_device(two_gpus):
    assert resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(CheckpointError, match="cuda:2 does not exist"):
        resolve_device("cuda:2")


def test_the_default_device_sizes_memory_without_an_error(two_gpus):
    """What every GPU start did first with the defaults (model.device = auto): the card's
    capacity for the memory plan. It raised for the index-less `cuda` auto gave."""
    device = resolve_device("auto")
    assert capacity_bytes(device) == 80 * GIB and free_bytes(device) == 70 * GIB


def test_memory_figures_refuse_an_index_less_device():
    """Nothing below the resolution gets an index-less device: the memory helpers say so
    before any torch.cuda call (this runs without CUDA)."""
    for call in (capacity_bytes, free_bytes):
        with pytest.raises(ValueError, match="expected an indexed CUDA device"):
            call(torch.device("cuda"))


def test_no_cuda_is_a_one_line_error_and_auto_is_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(CheckpointError, match="no CUDA device is available"):
        resolve_device("cuda")


@pytest.mark.parametrize("configured", [None, "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"])
def test_expandable_segments_unless_the_allocator_is_configured(monkeypatch, configured):
    """serve, bench and the tests ask for expandable segments; a user's own allocator settings,
    under either of torch's names, are left as they are."""
    from kimiaudio.layers.cuda_allocator_settings import prefer_expandable_segments

    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    if configured:
        monkeypatch.setenv(configured, "max_split_size_mb:128")
    prefer_expandable_segments()
    if configured:
        assert os.environ[configured] == "max_split_size_mb:128"
        assert sum(name in os.environ for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")) == 1
    else:
        assert os.environ["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
