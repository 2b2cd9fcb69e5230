"""The LM is assembled one decoder layer at a time (models.kimia_lm.assemble_lm): the promise
that lets 8-bit weights load on a 24 GB card, whose bf16 LM alone would not fit beside the rest.

Tracked with weak references to the tensors as they are read: a layer's full-precision
projection weights must be gone (fused, quantized, freed) by the time the next layer's last
tensor is read, from the golden checkpoint's file and from the random weights alike.
"""

from __future__ import annotations

import weakref

import pytest
import torch

from kimiaudio.checkpoint.files import iter_safetensors
from kimiaudio.checkpoint.paths import find_checkpoint
from kimiaudio.errors import CheckpointError
from kimiaudio.layers.quant_linear import QuantLinear
from kimiaudio.models.kimia_config import KimiaConfig
from kimiaudio.models.kimia_lm import _layer_prefix, assemble_lm, load_lm
from kimiaudio.models.quantize import quantize_lm
from kimiaudio.random_weights.lm import iter_lm_tensors, lm_config
from kimiaudio.random_weights.shapes import shape_named

KEEP = ("model.", "lm_head.", "mimo_output.")
IGNORE = ("rotary_emb.inv_freq",)


def _sources(golden_checkpoint):
    paths = find_checkpoint(golden_checkpoint)
    golden = (KimiaConfig.from_file(paths.lm_config), lambda: iter_safetensors(paths.root, KEEP, torch.float32))
    cfg = lm_config(shape_named("tiny"))
    tiny = (KimiaConfig.from_dict(cfg, "tiny"), lambda: iter_lm_tensors(0, cfg))
    return {"golden": golden, "random": tiny}


class Watch:
    """Wraps a tensor stream; before each tensor it records which layers still have a
    full-precision projection weight alive."""

    def __init__(self, stream):
        self.stream, self.read, self.alive_before = stream, [], []

    def alive_layers(self) -> set[str]:
        return {_layer_prefix(name) for name, ref in self.read if "_proj.weight" in name and ref() is not None}

    def __iter__(self):
        for name, tensor in self.stream:
            self.alive_before.append(self.alive_layers())
            self.read.append((name, weakref.ref(tensor)))
            yield name, tensor
            del tensor


@pytest.mark.parametrize("source", ["golden", "random"])
@pytest.mark.parametrize("weights", ["int8", "fp8"])
def test_one_layer_of_full_precision_weights_at_a_time(golden_checkpoint, source, weights):
    config, stream = _sources(golden_checkpoint)[source]
    watch = Watch(stream())
    lm = assemble_lm(config, watch, "cpu", torch.float32, weights, source, ignore=IGNORE)
    layer_count = config.num_hidden_layers + config.kimia_mimo_layers
    assert layer_count >= 2
    # At most one layer (the one arriving) ever had projection weights in full precision...
    assert max(len(alive) for alive in watch.alive_before) == 1
    # ...and none is left once assembled: every projection of every layer was quantized.
    assert watch.alive_layers() == set()
    layers = [*lm.model.layers, *lm.model.mimo_layers]
    linears = [m for layer in layers for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    quantized = [m for layer in layers for m in layer.modules() if isinstance(m, QuantLinear)]
    assert not linears and len(quantized) == 4 * layer_count  # qkv, o, gate_up, down
    assert lm.weights == weights and not any(p.is_meta for p in lm.parameters())


@pytest.mark.parametrize("weights", ["int8", "fp8"])
def test_assembled_equals_quantizing_the_loaded_model(golden_checkpoint, weights):
    paths = find_checkpoint(golden_checkpoint)
    streamed = load_lm(paths, "cpu", torch.float32, weights=weights).state_dict()
    afterwards = quantize_lm(load_lm(paths, "cpu", torch.float32), weights).state_dict()
    assert streamed.keys() == afterwards.keys()
    for name, tensor in streamed.items():
        assert tensor.dtype == afterwards[name].dtype, name
        assert torch.equal(tensor.float(), afterwards[name].float()), name


def test_layout_errors_while_streaming(golden_checkpoint):
    config, stream = _sources(golden_checkpoint)["golden"]

    def edited(extra=None, drop=None, reshape=None):
        for name, tensor in stream():
            if name == drop:
                continue
            yield name, (tensor[:-1] if name == reshape else tensor)
        if extra:
            yield extra, torch.zeros(1)

    with pytest.raises(CheckpointError, match=r"^ckpt: unexpected tensor 'model.extra.weight'$"):
        assemble_lm(config, edited(extra="model.extra.weight"), "cpu", torch.float32, source="ckpt")
    with pytest.raises(CheckpointError, match=r"^ckpt: missing tensor 'model.layers.1.mlp.up_proj.weight' \(1 missing"):
        assemble_lm(config, edited(drop="model.layers.1.mlp.up_proj.weight"), "cpu", torch.float32, source="ckpt")
    with pytest.raises(CheckpointError, match=r"^ckpt: tensor 'model.norm.weight' has shape \(\d+,\), expected"):
        assemble_lm(config, edited(reshape="model.norm.weight"), "cpu", torch.float32, source="ckpt")
    # An ignored name is skipped, not an error (the official rotary buffers).
    lm = assemble_lm(
        config,
        edited(extra="model.layers.0.self_attn.rotary_emb.inv_freq"),
        "cpu",
        torch.float32,
        source="ckpt",
        ignore=IGNORE,
    )
    assert not any(p.is_meta for p in lm.parameters())
