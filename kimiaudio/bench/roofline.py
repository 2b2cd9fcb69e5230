"""The floors an LM step is held to: the bytes a decode step reads over the device's copy
bandwidth, a prefill's matmul FLOPs over the device's matmul FLOP/s, both measured here.
"""

from __future__ import annotations

import time

import torch

from kimiaudio.models.kimia_lm import KimiAudioLM


def decode_weight_bytes(lm: KimiAudioLM) -> int:
    """Bytes one decode step reads: all parameters except the two embedding lookups' tables
    (only B rows of embed_tokens are read) and the VQ adaptor (prefill only). Quantized layers'
    parameters are their int8 / fp8 weights and fp32 scales: what the step reads of them."""
    skip = ("embed_tokens", "vq_adaptor")
    return sum(p.numel() * p.element_size() for n, p in lm.named_parameters() if not any(s in n for s in skip))


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Bytes/s of a device-to-device copy (read + write counted)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    _sync(device)
    start, reps = time.perf_counter(), 10
    for _ in range(reps):
        dst.copy_(src)
    _sync(device)
    return 2 * nbytes * reps / (time.perf_counter() - start)


def matmul_flops(device: torch.device, dtype: torch.dtype, n: int) -> float:
    """FLOP/s of an n x n x n matmul in `dtype` (the compute roof prefill GEMMs can reach)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    for _ in range(2):
        a @ b
    _sync(device)
    start, reps = time.perf_counter(), 10
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - start)


def prefill_flops(lm: KimiAudioLM, positions: int, continuous: int) -> float:
    """Matmul FLOPs of one prompt's prefill: every layer's projections at every position, the
    causal attention scores and sums, the VQ adaptor at the continuous positions, both heads
    at the last position only."""
    cfg = lm.config
    layers = [*lm.model.layers, *lm.model.mimo_layers]
    per_position = sum(
        p.numel() for layer in layers for n, p in layer.named_parameters() if n.endswith("weight") and p.dim() == 2
    )
    attention = len(layers) * 2 * 2 * (positions * (positions + 1) // 2) * cfg.hidden_size  # q.k and p.v
    vq_adaptor = lm.model.vq_adaptor
    adaptor = sum(p.numel() for p in vq_adaptor.parameters() if p.dim() == 2) if vq_adaptor is not None else 0
    heads = lm.lm_head.weight.numel() + lm.mimo_output.weight.numel()
    return 2.0 * (per_position * positions + adaptor * continuous + heads) + attention


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
