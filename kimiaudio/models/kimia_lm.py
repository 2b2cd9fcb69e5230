"""The Kimi-Audio LM: Qwen2 trunk, MIMO audio branch, VQ adaptor, text and audio heads.

Follows the official MoonshotKimiaForCausalLM (modeling_moonshot_kimia.py):
- input embedding: embed(audio ids); at continuous positions (embed + VQAdaptor(whisper
  feature)) * sqrt(2), with sqrt(2) a tensor in the model dtype; then + embed(text ids), but
  only where `use_text` is set (the official code skips the text embedding of a whole forward
  call whose text ids sum to 0; the caller decides this per call and passes it per token);
- trunk layers 0..L-1, then norm and lm_head -> text logits;
- MIMO branch: the trunk hidden state after layer `kimia_mimo_transformer_from_layer_index`
  runs through the mimo layers, mimo_norm and mimo_output -> audio logits.
Token-major layout ([T, H], all sequences of a batch packed along T); the attention backend
owns the KV cache (trunk layers are slots 0..L-1, MIMO layers L..L+M-1).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from kimiaudio.checkpoint.files import iter_safetensors
from kimiaudio.checkpoint.paths import CheckpointPaths
from kimiaudio.checkpoint.tensor_check import TensorCheck
from kimiaudio.errors import KimiAudioError
from kimiaudio.layers.attention import AttentionBackend
from kimiaudio.layers.decode_linear import DecodeLinear
from kimiaudio.layers.norm import RMSNorm
from kimiaudio.layers.quant_linear import quantize_linears
from kimiaudio.layers.rotary import RotaryEmbedding
from kimiaudio.models.kimia_config import KimiaConfig
from kimiaudio.models.quantize import scheme_of
from kimiaudio.models.qwen2 import Qwen2DecoderLayer

# The ModuleLists of decoder layers under `model.` (the trunk, then the MIMO branch).
DECODER_STACKS = ("layers", "mimo_layers")


class VQAdaptor(nn.Module):
    """Whisper feature [N, adaptor_dim] -> [N, H]; indices 0..4 as in the checkpoint."""

    def __init__(self, config: KimiaConfig):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(config.kimia_adaptor_input_dim, config.hidden_size, bias=True),
            nn.SiLU(),
            nn.Dropout(0.0),
            nn.Linear(config.hidden_size, config.hidden_size, bias=True),
            nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps),  # eps is rms_norm_eps, as official
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class KimiaModel(nn.Module):
    """The `model.*` part of the checkpoint."""

    def __init__(self, config: KimiaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen2DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mimo_layers = nn.ModuleList(
            Qwen2DecoderLayer(config, config.num_hidden_layers + i) for i in range(config.kimia_mimo_layers)
        )
        self.mimo_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.vq_adaptor = VQAdaptor(config) if config.use_whisper_feature else None


class KimiAudioLM(nn.Module):
    def __init__(self, config: KimiaConfig):
        super().__init__()
        self.config = config
        self.model = KimiaModel(config)
        self.lm_head = DecodeLinear(config.hidden_size, config.vocab_size, bias=False)
        self.mimo_output = DecodeLinear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position_embeddings)
        self.weights = "bf16"  # its decoder layers' linear weights: bf16 (as loaded), fp8 or int8 (quantize.py)

    def fuse_projections(self) -> KimiAudioLM:
        """Merge every layer's q/k/v and gate/up projections (see qwen2.fuse_linears); call
        after the weights are loaded by their official names."""
        for layer in [*self.model.layers, *self.model.mimo_layers]:
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def embed(
        self,
        audio_ids: torch.Tensor,
        text_ids: torch.Tensor,
        use_text: torch.Tensor,
        features: torch.Tensor | None = None,
        feature_positions: torch.Tensor | None = None,
        continuous: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """audio_ids, text_ids [T] long, use_text [T] bool -> input embeddings [T, H].

        features [N, adaptor_dim] go to the N continuous positions `feature_positions` [N] long,
        in order. Positions, not a [T] mask: finding a mask's positions on the GPU would wait for
        it, and every caller knows them on the host. Or, in the static shape a CUDA graph
        captures: features [T, adaptor_dim], one row per token, added where `continuous` [T]
        bool is set (the other rows are computed and dropped).
        """
        hidden = self.model.embed_tokens(audio_ids)  # [T, H]
        # Official: without the VQ adaptor (use_whisper_feature = false) features are ignored.
        if features is not None and features.shape[0] > 0 and self.model.vq_adaptor is not None:
            index = None
            if continuous is None:
                if feature_positions is None:
                    raise KimiAudioError("continuous features were given without their positions")
                if feature_positions.shape[0] != features.shape[0]:
                    raise KimiAudioError(
                        f"{features.shape[0]} continuous feature rows for {feature_positions.shape[0]} "
                        "continuous positions"
                    )
                index = feature_positions
            adapted = self.model.vq_adaptor(features.to(hidden.dtype))  # [N, H] (or [T, H])
            # sqrt(2) rounded to the model dtype, as official; a fill, not a host-to-device copy.
            sqrt2 = torch.full((), 2.0, dtype=hidden.dtype, device=hidden.device).sqrt()
            if index is not None:
                hidden = hidden.index_copy(0, index, (hidden[index] + adapted) * sqrt2)
            elif continuous is not None:
                hidden = torch.where(continuous[:, None], (hidden + adapted) * sqrt2, hidden)
        text = self.model.embed_tokens(text_ids)
        return torch.where(use_text[:, None], hidden + text, hidden)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionBackend,
        logits_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [T, H], positions [T] -> (text_logits, audio_logits), each [R, V].

        Every token runs through every layer (the KV cache needs them all); only the R rows of
        `logits_rows` (default: all T) go through the final norms and heads.
        """
        cos, sin = self.rotary(positions, hidden.dtype)
        branch_after = self.config.kimia_mimo_transformer_from_layer_index
        residual = None
        for i, layer in enumerate(self.model.layers):
            hidden, residual = layer(hidden, residual, cos, sin, attn)  # the state is hidden + residual
            if i == branch_after:
                mimo, mimo_residual = hidden, residual  # the official mimo_h = h.clone()
        for layer in self.model.mimo_layers:
            mimo, mimo_residual = layer(mimo, mimo_residual, cos, sin, attn)
        if residual is None:
            raise KimiAudioError("the LM has no decoder layers")
        if logits_rows is not None:
            hidden, residual = hidden[logits_rows], residual[logits_rows]
            mimo, mimo_residual = mimo[logits_rows], mimo_residual[logits_rows]
        text_logits = self.lm_head(self.model.norm(hidden, residual)[0])
        audio_logits = self.mimo_output(self.model.mimo_norm(mimo, mimo_residual)[0])
        return text_logits, audio_logits


def load_lm(
    paths: CheckpointPaths,
    device: torch.device | str,
    dtype: torch.dtype,
    progress: bool = False,
    weights: str = "bf16",
) -> KimiAudioLM:
    """Build the LM from config.json and its safetensors weights by name, one decoder layer at
    a time (assemble_lm); `weights` fp8 or int8 quantizes its decoder layers (models/quantize.py),
    bf16 keeps them in `dtype`. The checkpoint's rotary inv_freq buffers are recomputed."""
    config = KimiaConfig.from_file(paths.lm_config)
    index = paths.root / "model.safetensors.index.json"
    source = index if index.is_file() else paths.root / "model.safetensors"
    tensors = iter_safetensors(paths.root, keep=("model.", "lm_head.", "mimo_output."), dtype=dtype, progress=progress)
    return assemble_lm(config, tensors, device, dtype, weights, source, ignore=("rotary_emb.inv_freq",))


@torch.no_grad()
def assemble_lm(
    config: KimiaConfig,
    tensors: Iterable[tuple[str, torch.Tensor]],
    device: torch.device | str,
    dtype: torch.dtype,
    weights: str = "bf16",
    source: Path | str = "LM weights",
    ignore: tuple[str, ...] = (),
) -> KimiAudioLM:
    """The LM from its tensors by official name, placed as they arrive.

    A decoder layer is built on `device` as soon as its last tensor has come, then fused and
    quantized, so besides the finished model the device (and the host, for a checkpoint read
    tensor by tensor) holds only the layers still arriving, in `dtype`: one, when the tensors
    come layer by layer as the official shards and the random weights order them. A 24 GB card
    could not hold the bf16 LM before quantizing it. The other tensors (embeddings, norms,
    adaptor, heads) are final as they come. Names and shapes are checked (TensorCheck).
    """
    device = torch.device(device)
    with torch.device("meta"):
        lm = KimiAudioLM(config).to(dtype)
    check = TensorCheck(lm, source, ignore)
    dtypes = {name: t.dtype for name, t in lm.state_dict().items()}
    layers: dict[str, Qwen2DecoderLayer] = {
        f"model.{kind}.{i}.": layer for kind in DECODER_STACKS for i, layer in enumerate(getattr(lm.model, kind))
    }
    wanted = {prefix: len(layer.state_dict()) for prefix, layer in layers.items()}
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors:
        if not check.admit(name, tensor):
            continue
        tensor = tensor.to(device=device, dtype=dtypes[name])
        prefix = _layer_prefix(name)
        part = pending.setdefault(prefix, {})
        part[name.removeprefix(prefix)] = tensor
        del tensor
        if prefix and len(part) == wanted[prefix]:
            _finish_layer(layers[prefix], pending.pop(prefix), weights)
    check.finish()
    lm.load_state_dict(pending.pop("", {}), strict=False, assign=True)  # all but the layers: final as they are
    lm.weights = weights
    return lm.eval().requires_grad_(False)


def _layer_prefix(name: str) -> str:
    """ "model.layers.3.mlp.up_proj.weight" -> "model.layers.3."; "" outside the decoder layers."""
    parts = name.split(".")
    return ".".join(parts[:3]) + "." if parts[1] in DECODER_STACKS else ""


def _finish_layer(layer: Qwen2DecoderLayer, state: dict[str, torch.Tensor], weights: str) -> None:
    layer.load_state_dict(state, strict=True, assign=True)
    state.clear()  # the layer holds its tensors now; fusing and quantizing free the originals
    layer.self_attn.fuse_projections()
    layer.mlp.fuse_projections()
    quantize_linears(layer, scheme_of(weights))
