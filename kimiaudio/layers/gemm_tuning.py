"""Choosing the skinny GEMM's tiles by measurement on the GPU, once, as the engine starts.

The tile table (gemm_tiles.py) is a starting point: the best tile depends on the GPU (its SMs,
its bandwidth, its L2) and on each layer's shape. Before the decode graphs are captured, the
engine calls `tune_linears` with the batch sizes it will run; for every group of linear layers
of one shape and format, and every bucket of rows those sizes reach, each candidate tile (and
cuBLAS, for 16-bit weights) runs the group's products at the bucket's largest size, and the
fastest is kept by every layer of the group (LayerTiles.chosen). A pass runs every layer of the
group once, so the weights stream from memory as in a decode step (one layer's weights alone
would sit in L2). Each candidate's pass is captured in a CUDA graph and its replays are timed,
as the decode graphs will run it: launched one by one from Python, a Triton kernel's launch
takes longer than a decode-sized product runs, so eager timings would measure the host (on an
H200 they put 114 us on a product the captured step ran in about 37). The graphs then capture
the chosen tiles. CUDA only; the CPU keeps the table.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import nn

from kimiaudio.layers.decode_linear import DecodeLinear
from kimiaudio.layers.gemm_tiles import BUCKETS, CANDIDATES, LARGE, Tile, bucket_of
from kimiaudio.layers.quant_linear import QuantLinear

log = logging.getLogger(__name__)

SkinnyLayer = QuantLinear | DecodeLinear  # the layers the skinny GEMM serves
PASSES = 5  # timed passes over a group, after one that compiles and warms up


@dataclass(frozen=True)
class Choice:
    """The tile a group of layers keeps for one bucket, with what it and the default measured."""

    layers: str  # the group: format, shape, how many layers
    rows: int  # the bucket's largest batch, as measured
    tile: Tile | str
    us_per_layer: float
    default_us_per_layer: float


def tune_linears(model: nn.Module, batch_sizes: list[int], dtype: torch.dtype) -> list[Choice]:
    """Measure the candidate tiles of every skinny-GEMM layer of `model` (on CUDA) for the
    buckets of `batch_sizes` and keep the fastest; buckets a layer already chose are skipped
    (a second engine over the same model). -> what was chosen."""
    groups: dict[tuple, list[SkinnyLayer]] = defaultdict(list)
    for layer in model.modules():
        if isinstance(layer, (QuantLinear, DecodeLinear)):
            key = _group_key(layer, dtype)
            if key is not None:
                groups[key].append(layer)
    most_rows: dict[int, int] = {}
    for rows in batch_sizes:
        bucket = bucket_of(rows)
        if bucket < LARGE:
            most_rows[bucket] = max(most_rows.get(bucket, 0), rows)
    choices = []
    start = time.perf_counter()
    for (fmt, n, k, _), layers in groups.items():
        for bucket, rows in sorted(most_rows.items()):
            if bucket in layers[0].tiles.chosen or len(CANDIDATES[fmt][bucket]) < 2:
                continue
            times = _time_candidates(layers, fmt, bucket, rows, k, dtype)
            best = min(times, key=lambda candidate: times[candidate])
            for layer in layers:
                layer.tiles.chosen[bucket] = best
            name = f"{fmt} {n}x{k} x{len(layers)}"
            default = times.get(CANDIDATES[fmt][bucket][0], float("nan"))
            choices.append(Choice(name, rows, best, times[best], default))
    if choices:
        log.info(
            "skinny GEMM tiles measured in %.1f s: %s",
            time.perf_counter() - start,
            "; ".join(f"{c.layers} @{c.rows}: {c.tile} {c.us_per_layer:.1f} us" for c in choices),
        )
    return choices


def _group_key(layer: SkinnyLayer, dtype: torch.dtype) -> tuple | None:
    """(format, out, in, has bias) of a layer the skinny GEMM serves on CUDA, else None."""
    weight: torch.Tensor
    if isinstance(layer, QuantLinear):
        fmt, weight = layer.scheme, layer.qweight
    elif isinstance(layer, DecodeLinear) and dtype in (torch.bfloat16, torch.float16):
        fmt, weight = "bf16", layer.weight
    else:
        return None
    if weight.device.type != "cuda":
        return None
    return fmt, weight.shape[0], weight.shape[1], layer.bias is not None


@torch.inference_mode()
def _time_candidates(
    layers: list[SkinnyLayer], fmt: str, bucket: int, rows: int, k: int, dtype: torch.dtype
) -> dict[Tile | str, float]:
    """Microseconds a layer for each candidate that runs (one that fails to compile, launch or be
    captured on this GPU, e.g. out of shared memory, is left out)."""
    device = next(layers[0].parameters()).device
    x = torch.randn(rows, k, device=device).to(dtype)
    stream = torch.cuda.Stream(device)
    pool = torch.cuda.graph_pool_handle()  # every candidate's pass reuses the same memory
    times: dict[Tile | str, float] = {}
    low, high = BUCKETS[bucket]
    for candidate in CANDIDATES[fmt][bucket]:
        for layer in layers:
            layer.tiles.chosen[bucket] = candidate
        try:
            graph = _captured_pass(layers, x, stream, pool)
        except Exception as error:  # a tile this GPU cannot run (shared memory, registers) is no candidate
            log.warning("skinny GEMM: %s for %d-%d rows of %s does not run here: %s", candidate, low, high, fmt, error)
            continue
        graph.replay()
        passes = []
        for _ in range(PASSES):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            graph.replay()
            end.record()
            end.synchronize()
            passes.append(begin.elapsed_time(end) * 1e3 / len(layers))
        times[candidate] = statistics.median(passes)
        del graph
    for layer in layers:
        layer.tiles.chosen.pop(bucket, None)
    if not times:
        raise RuntimeError(f"skinny GEMM: no tile runs {fmt} products of {rows} rows on this GPU")
    return times


def _captured_pass(layers: list[SkinnyLayer], x: torch.Tensor, stream: torch.cuda.Stream, pool) -> torch.cuda.CUDAGraph:
    """One pass of `layers` over `x`, run once on `stream` (compiles, and makes what a stream
    needs on first use, such as cuBLAS's workspace), then captured there. (Not torch.cuda.graph,
    which collects garbage and empties the allocator's cache before each of the tuner's many
    captures.)"""
    graph = torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(stream):
        for layer in layers:
            layer(x)
        stream.synchronize()
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            for layer in layers:
                layer(x)
        finally:
            graph.capture_end()
    torch.cuda.current_stream(x.device).wait_stream(stream)
    return graph
