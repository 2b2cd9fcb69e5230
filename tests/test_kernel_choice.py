"""Which path an op takes (layers/triton_support.py): the CPU's is torch's unless the kernels
are asked for in Triton's interpreter; CUDA's is Triton's when it imports."""

import pytest
import torch

from kimiaudio.errors import ConfigError
from kimiaudio.layers import triton_support

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture
def choose(monkeypatch):
    """choose(KIMIAUDIO_KERNELS, TRITON_INTERPRET, triton importable, device) -> use_triton's answer."""

    def choose(kernels: str, interpret: str | None, importable: bool, device: torch.device) -> bool:
        monkeypatch.setenv("KIMIAUDIO_KERNELS", kernels)
        if interpret is None:
            monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        else:
            monkeypatch.setenv("TRITON_INTERPRET", interpret)
        monkeypatch.setattr(triton_support, "triton_importable", lambda: importable)
        triton_support.kernel_mode.cache_clear()
        return triton_support.use_triton(device)

    yield choose
    triton_support.kernel_mode.cache_clear()


def test_the_cpu_runs_torch_unless_the_interpreter_is_asked_for(choose):
    assert not choose("auto", None, True, CPU)
    assert not choose("auto", "1", True, CPU)  # the interpreter on (a test module set it): still torch
    assert not choose("torch", "1", True, CPU)
    assert choose("triton", "1", True, CPU)
    for interpret, importable in ((None, True), ("0", True), ("1", False)):
        with pytest.raises(ConfigError, match="TRITON_INTERPRET=1"):
            choose("triton", interpret, importable, CPU)


def test_cuda_runs_triton_when_it_imports(choose):
    assert choose("auto", None, True, CUDA) and not choose("auto", None, False, CUDA)
    assert choose("triton", None, True, CUDA) and not choose("torch", None, True, CUDA)


def test_an_unknown_kernel_mode_is_a_config_error_naming_the_variable(choose):
    # (a ConfigError is a user's error: one line at start, not an "internal error")
    with pytest.raises(ConfigError, match="KIMIAUDIO_KERNELS='junk': expected one of auto, torch, triton"):
        choose("junk", None, True, CPU)
