"""A float32 run on CUDA turns TF32 off for matmuls and convolutions (layers/precision.py); a
bf16 run and any CPU run leave the process's flags as they were. The flags are plain settings,
so this runs without a GPU."""

from __future__ import annotations

import pytest
import torch

from kimiaudio.layers.precision import exact_float32


@pytest.fixture
def tf32_on():
    """TF32 allowed everywhere (convolutions allow it by default), put back afterwards."""
    saved = flags()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])


def flags() -> tuple[bool, bool, str]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()


def test_bf16_and_the_cpu_leave_tf32_alone(tf32_on):
    assert not exact_float32(torch.device("cuda", 0), torch.bfloat16)
    assert not exact_float32(torch.device("cpu"), torch.float32)
    assert flags() == (True, True, "high")


def test_float32_on_cuda_turns_tf32_off(tf32_on):
    assert exact_float32(torch.device("cuda", 0), torch.float32)
    assert flags() == (False, False, "highest")


def test_a_cuda_stack_takes_cudnn_out_of_every_sdpa_call():
    """layers/attention.py pin_sdpa_backends: cuDNN's attention builds a plan for every new shape,
    so a CUDA process turns it off for all of its SDPA calls; a CPU one leaves the flag alone."""
    from kimiaudio.layers.attention import pin_sdpa_backends

    saved = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        pin_sdpa_backends(torch.device("cpu"))
        assert torch.backends.cuda.cudnn_sdp_enabled()
        pin_sdpa_backends(torch.device("cuda", 0))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(saved)
