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

from torch import nn

from kimiaudio.layers.quant_linear import quantize_linears

def scheme_of(choice: str) -> str | None:
    """A resolved weights choice -> the QuantLinear scheme (None: not quantized)."""
    if choice == "auto":
        raise ValueError("weights = auto must be resolved before loading")
    return None if choice == "bf16" else choice


def quantize_lm(lm: nn.Module, choice: str) -> nn.Module:
    """Quantize lm's decoder layers in place (after fuse_projections), one layer at a time."""
    scheme = scheme_of(choice)
    for layer in [*lm.model.layers, *lm.model.mimo_layers]:
        quantize_linears(layer, scheme)
    lm.weights = choice
    return lm


def quantize_dit(dit: nn.Module, choice: str) -> nn.Module:
    scheme = scheme_of(choice)
    for part in [*dit.blocks, dit.final_layer]:
        quantize_linears(part, scheme)
    dit.weights = choice
    return dit
