"""Which linear layers of the models are quantized at load (`[model] weights`, `[detok] weights`).

The LM: every linear of every trunk and MIMO decoder layer (the fused q/k/v and gate/up, o_proj,
down_proj): 81% of its parameters and all of what a decode step reads but the heads. The
embeddings, the norms, the VQ adaptor (prefill only) and both output heads (lm_head,
mimo_output: their logits pick the tokens) stay in the model dtype.

The DiT: every linear of its blocks and final layer. Its input projection and timestep MLP
stay (0.1% of its parameters): the detokenizer takes the DiT's dtype and device from them.

The choice values: "bf16" = not quantized (the weights in model.dtype), "fp8", "int8"; "auto"
is resolved before loading (pipeline/memory_plan.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from typing import Protocol, TypeVar

import torch
from torch import nn

from kimiaudio.layers.quant_linear import quantize_linears


class _DecoderStacks(Protocol):
    @property
    def layers(self) -> nn.ModuleList: ...

    @property
    def mimo_layers(self) -> nn.ModuleList: ...


class QuantizableLM(Protocol):
    """What quantize_lm reads of the LM (models/kimia_lm.py's KimiAudioLM)."""

    weights: str

    @property
    def model(self) -> _DecoderStacks: ...


class QuantizableDiT(Protocol):
    """What quantize_dit reads of the DiT (models/dit.py's DiTPrefix)."""

    weights: str

    @property
    def blocks(self) -> nn.ModuleList: ...

    @property
    def final_layer(self) -> nn.Module: ...

    def parameters(self, recurse: bool = ...) -> Iterator[nn.Parameter]: ...

    def buffers(self, recurse: bool = ...) -> Iterator[torch.Tensor]: ...

    def named_children(self) -> Iterator[tuple[str, nn.Module]]: ...


LM = TypeVar("LM", bound=QuantizableLM)
DiT = TypeVar("DiT", bound=QuantizableDiT)


def scheme_of(choice: str) -> str | None:
    """A resolved weights choice -> the QuantLinear scheme (None: not quantized)."""
    if choice == "auto":
        raise ValueError("weights = auto must be resolved before loading")
    return None if choice == "bf16" else choice


def quantize_lm(lm: LM, choice: str) -> LM:
    """Quantize lm's decoder layers in place (after fuse_projections), one layer at a time."""
    scheme = scheme_of(choice)
    for layer in [*lm.model.layers, *lm.model.mimo_layers]:
        quantize_linears(layer, scheme)
    lm.weights = choice
    return lm


def quantize_dit(dit: DiT, choice: str, device: torch.device | None = None, dtype: torch.dtype | None = None) -> DiT:
    """Quantize the DiT's blocks and final layer in place. With `device`, the DiT also moves
    there (in `dtype`) one block at a time, each quantized before the next moves: the device
    never holds the whole DiT in full precision (2.95 GiB in bf16 at full size)."""
    scheme = scheme_of(choice)
    quantized = [*dit.blocks, dit.final_layer]
    for part in quantized:
        if device is not None:
            part.to(device=device, dtype=dtype)
        quantize_linears(part, scheme)
    if device is not None:
        # The rest, without touching the quantized parts (Module.to(dtype) would cast fp8 weights).
        if any(True for _ in chain(dit.parameters(recurse=False), dit.buffers(recurse=False))):
            raise ValueError("quantize_dit: the DiT holds tensors of its own; move them too")
        for name, child in dit.named_children():
            if name not in ("blocks", "final_layer"):
                child.to(device=device, dtype=dtype)
    dit.weights = choice
    return dit
