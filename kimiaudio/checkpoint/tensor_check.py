"""The names and shapes a module expects of a checkpoint, checked tensor by tensor as it is read.

A name the module does not have is a layout mismatch, unless it matches `ignore` (substrings:
e.g. the rotary inv_freq buffers the official code recomputes); a wrong shape names both shapes;
what never came is reported once reading ends. Every problem is a one-line CheckpointError that
starts with the file (`source`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from kimiaudio.errors import CheckpointError


class TensorCheck:
    def __init__(self, module: torch.nn.Module, source: Path | str, ignore: tuple[str, ...] = ()):
        self.shapes = {name: tuple(t.shape) for name, t in module.state_dict().items()}
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
        self.seen.add(name)
        return True

    def finish(self) -> None:
        """Raise if a tensor the module needs never came."""
        missing = [name for name in self.shapes if name not in self.seen]
        if missing:
            raise CheckpointError(f"{self.source}: missing tensor {missing[0]!r} ({len(missing)} missing in all)")
