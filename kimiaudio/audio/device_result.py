"""Inputs and outputs crossing between host and device without the host waiting.

The speech encoders run on a CUDA stream of their own beside the LM's decode steps
(pipeline/speech_encoding.py). Their inputs go to the device from pinned host memory,
asynchronously on the current stream (`to_device`). Their outputs stay on the device as a
`DeviceResult` (the tensors, and how their host copies become per-utterance values) until a
`HostCopy` copies them into pinned host memory on the same stream and records an event after
the copies. The LM worker polls `ready()` between engine steps and reads `value()` once the
stream has got there: no host synchronisation per batch or per utterance, and no device tensor
crosses to another stream (the engine copies a prompt's features from the host on its own).
The engine's step inputs take the same way in (`to_device`; `copy_in` for the static buffers
its CUDA graphs read), and a launched step's samples come back through a HostCopy
(engine/launched_step.py). On the CPU every operation is synchronous: a result is ready as
soon as it exists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch
from torch import Tensor

from kimiaudio.audio.staged_work import Stages, run_to_end

T = TypeVar("T")
A = TypeVar("A")
B = TypeVar("B")


def to_device(tensor: Tensor, device: torch.device) -> Tensor:
    """A host tensor on `device`: on CUDA through pinned memory, without the host waiting for
    the copy (it is ordered on the current stream); elsewhere an ordinary copy."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def copy_in(buffer: Tensor, host: Tensor) -> None:
    """A fresh host tensor into a device buffer allocated once (a static input of a CUDA
    graph), ordered on the current stream: on CUDA through pinned memory, as `to_device`, so
    the host does not wait for the work queued before it (the engine writes a launched step's
    inputs while the step before it still runs)."""
    buffer.copy_(host.pin_memory() if buffer.is_cuda else host, non_blocking=True)


@dataclass
class DeviceResult(Generic[T]):
    """A batch's outputs still on the device, and how their host copies (same order, same
    shapes) become its value."""

    tensors: list[Tensor]
    finish: Callable[[list[Tensor]], T]

    @staticmethod
    def join(first: DeviceResult[A], second: DeviceResult[B], combine: Callable[[A, B], T]) -> DeviceResult[T]:
        """One result of two: both copied together, their values combined."""
        split = len(first.tensors)

        def finish(host: list[Tensor]) -> T:
            return combine(first.finish(host[:split]), second.finish(host[split:]))

        return DeviceResult(first.tensors + second.tensors, finish)


class HostCopy(Generic[T]):
    """A DeviceResult on its way to the host: copied on the current stream, an event after the
    copies. Not thread-safe: one owner polls it."""

    def __init__(self, result: DeviceResult[T]):
        self._finish = result.finish
        self._event: torch.cuda.Event | None = None
        on_cuda = [t for t in result.tensors if t.is_cuda]
        if on_cuda:
            # Pinned host buffers: the copies run asynchronously on the stream (pageable ones would
            # make the host wait). The host allocator keeps each buffer until its copy is done.
            self._host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in result.tensors]
            for host, tensor in zip(self._host, result.tensors):
                host.copy_(tensor, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = list(result.tensors)
        self._result: tuple[T] | None = None  # (the value,) once finished

    def ready(self) -> bool:
        """The copies have landed (never waits)."""
        return self._event is None or self._event.query()

    def value(self) -> T:
        """The result's value (waits for the copies if they have not landed yet)."""
        if self._result is None:
            if self._event is not None:
                self._event.synchronize()
            self._result = (self._finish(self._host),)
            self._host = []  # the pinned buffers go back to the host allocator
        return self._result[0]


def compute_now(stages: Stages[DeviceResult[T]]) -> T:
    """Run every stage now and wait for the result on the host (the one-call encoders)."""
    return HostCopy(run_to_end(stages)).value()
