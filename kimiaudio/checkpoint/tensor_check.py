"""The names and shapes a module expects of a checkpoint, checked tensor by tensor as it is read.

A name the module does not have is a layout mismatch, unless it matches `ignore` (substrings:
e.g. the rotary inv_freq buffers the official code recomputes); a wrong shape names both shapes;
an integer or bool tensor where the module holds floating-point values is not the weight
(copying it would cast it to float without a word), while where the module itself holds
integers (a buffer the code expects so) any dtype is taken; what never came is reported once
reading ends. Every problem is a one-line CheckpointError that starts with the file (`source`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from kimiaudio.errors import CheckpointError


class TensorCheck:
    def __init__(self, module: torch.nn.Module, source: Path | str, ignore: tuple[str, ...] = ()):
        state = module.state_dict()
        self.shapes = {name: tuple(t.shape) for name, t in state.items()}
        self.floating = {name for name, t in state.items() if t.is_floating_point()}
        self.source, self.ignore = source, ignore
        self.seen: set[str] = set()

    def admit(self, name: str, tensor: torch.Tensor) -> bool:
        """True for a tensor the module takes, False for an ignored name; raises otherwise."""
        if name not in self.shapes:
            if any(part in name for part in self.ignore):
                return False
            raise CheckpointError(f"{self.source}: unexpected tensor {name!r}")
        if tuple(tensor.shape) != self.shapes[name]:
            raise CheckpointError(
                f"{self.source}: tensor {name!r} has shape {tuple(tensor.shape)}, expected {self.shapes[name]}"
            )
        if name in self.floating and not tensor.is_floating_point():
            raise CheckpointError(
                f"{self.source}: tensor {name!r} has dtype {str(tensor.dtype).removeprefix('torch.')}, "
                "expected a floating-point dtype"
            )
        self.seen.add(name)
        return True

    def finish(self) -> None:
        """Raise if a tensor the module needs never came."""
        missing = [name for name in self.shapes if name not in self.seen]
        if missing:
            raise CheckpointError(f"{self.source}: missing tensor {missing[0]!r} ({len(missing)} missing in all)")
