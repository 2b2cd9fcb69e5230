"""The tile table of the skinny GEMM (layers/skinny_gemm.py): which tile a linear layer's product
takes for a number of rows, per M bucket and weight format.

A decode step's GEMMs read every weight once and touch few activation rows, so their time is
the weight bytes over the memory bandwidth, reached only when the GPU has enough loads in
flight: enough programs (a split of K when the output alone gives too few tiles), each
streaming a wide stretch of K. The buckets are the decode batch's row counts, padded as the
CUDA graphs pad them (engine/decode_batch.py): 1 | 2-4 | 5-16 | 17-64; more rows (prefill)
take int8's compute tile, fp8's `_scaled_mm` or bf16's cuBLAS.

`Tile.dot` chooses the inner product: False multiplies on the CUDA cores, 1, 2 or 4 rows a
program, each weight converted once to fp32 and multiplied into every row's sum (a GEMV:
TensorRT-LLM's fp8 GEMV and GemLite's M=1 kernels run so); True runs `tl.dot` with the weight
tile as the left operand (out^T = W x^T: the weight rows fill the MMA's 64-row side and the few
activation rows its narrow side, vLLM's swap for small M). `TORCH` instead of a Tile: the
layer's torch product (cuBLAS, `_scaled_mm`) for that bucket, which the tuner
(layers/gemm_tuning.py) may pick where it measures faster.

The defaults are the starting point, not measurements: the tuner times `CANDIDATES` on the
GPU when the engine starts and keeps the fastest per layer shape and bucket; the CPU (and the
interpreter) uses the table as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

MAX_SKINNY_ROWS = 64  # decode batches up to here take the skinny tiles
BUCKETS = ((1, 1), (2, 4), (5, 16), (17, 64))  # inclusive row ranges
LARGE = len(BUCKETS)  # the bucket index of more rows than MAX_SKINNY_ROWS
TORCH = "torch"  # the torch product (cuBLAS) instead of a Triton tile
# Weight formats (the scheme of a QuantLinear; "bf16" for any 16-bit weight).
FORMATS = ("fp8", "int8", "bf16")
SEMAPHORES = 1024  # split-K semaphores a layer holds: split_k splits only below a few programs an SM


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    block_k: int
    dot: bool
    num_warps: int = 4
    num_stages: int = 3
    # Programs to aim for per SM: the split of K is chosen so that tiles x splits reaches
    # waves x SMs (1: never split).
    waves: int = 2


def bucket_of(rows: int) -> int:
    """Index of the bucket of `rows` (LARGE past MAX_SKINNY_ROWS)."""
    for index, (low, high) in enumerate(BUCKETS):
        if low <= rows <= high:
            return index
    if rows > MAX_SKINNY_ROWS:
        return LARGE
    raise ValueError(f"a product of {rows} rows: expected at least 1")


# 8-bit weights: at one row a CUDA-core GEMV 128 outputs wide (a 128 x 64 tile is 8 KiB of
# weights a program and step, 56 registers a thread: many programs an SM keep the loads in
# flight); then tl.dot with 16-row activation tiles up to 16 rows, a 64-row one past that (each
# activation row is re-read per output tile, from L2). Past 64 rows: int8 a compute tile, fp8
# `_scaled_mm` (TORCH) on activations quantized by the kernel before.
_EIGHT_BIT = (
    Tile(1, 128, 64, dot=False, waves=8),
    Tile(16, 64, 256, dot=True),
    Tile(16, 64, 256, dot=True),
    Tile(64, 64, 128, dot=True),
)
# A prefill is bound by compute, and each weight tile is widened once per 128 rows: wide tiles.
_COMPUTE = Tile(128, 128, 64, dot=True, num_warps=8, waves=1)
# 16-bit weights: the same shapes, half the K of a tile for the same bytes; cuBLAS past 64 rows.
_SIXTEEN_BIT = (
    Tile(1, 128, 32, dot=False, waves=8),
    Tile(16, 64, 128, dot=True),
    Tile(16, 64, 128, dot=True),
    Tile(64, 64, 64, dot=True),
    TORCH,
)
DEFAULTS: dict[str, tuple[Tile | str, ...]] = {
    "fp8": (*_EIGHT_BIT, TORCH),
    "int8": (*_EIGHT_BIT, _COMPUTE),
    "bf16": _SIXTEEN_BIT,
}


def _candidates(fmt: str, bucket: int) -> list[Tile | str]:
    """The tiles the tuner times for one bucket: the default and its neighbours in width, depth
    and split, plus cuBLAS (below)."""
    default = DEFAULTS[fmt][bucket]
    wide = 1 if fmt == "bf16" else 2  # K elements a tile row holds per byte of 16-bit rows
    tiles: list[Tile | str]
    if bucket == 0:
        tiles = [
            Tile(1, 64, 64 * wide, dot=False, waves=8),
            Tile(1, 128, 32 * wide, dot=False, waves=4),
            Tile(1, 128, 64 * wide, dot=False, num_warps=8, waves=4),
            Tile(16, 64, 128 * wide, dot=True),
        ]
    elif bucket < LARGE:
        block_m = 16 if bucket < 3 else 64
        tiles = [
            Tile(block_m, 64, 128 * wide, dot=True),
            Tile(block_m, 64, 64 * wide, dot=True, num_stages=4),
            Tile(block_m, 128, 64 * wide, dot=True, num_warps=8),
            Tile(block_m, 64, 128 * wide, dot=True, waves=4),
        ]
        if bucket == 1:  # 2-4 rows: the GEMV holding each row's sums apart
            tiles += [Tile(2, 128, 32 * wide, dot=False, waves=8), Tile(4, 64, 32 * wide, dot=False, waves=8)]
        if bucket == 3:
            # Every output tile reads all the rows' activations again (from L2): at 64 rows and
            # 64 outputs a tile that is twice the 8-bit weights' bytes, about what an H200's
            # fp8 tiles ran at (3.5x the bytes' floor). Wider tiles read them fewer times.
            tiles += [
                Tile(block_m, 128, 128 * wide, dot=True, num_warps=8),
                Tile(block_m, 256, 64 * wide, dot=True, num_warps=8),
            ]
    elif fmt == "int8":
        tiles = [_COMPUTE, Tile(64, 128, 64, dot=True, num_warps=8, waves=1)]
    else:  # cuBLAS / _scaled_mm alone
        tiles = []
    # cuBLAS beside the tiles: bf16's own product at every bucket; for fp8 from 5 rows,
    # `_scaled_mm` on activations quantized by the kernel before, whose tiles waste a GEMV's
    # rows below that. On an H200 the fp8 tiles ran at 1.7 TB/s at 64 rows, slower than bf16's
    # step: which is faster there is the tuner's to measure.
    if bucket < LARGE and (fmt == "bf16" or (fmt == "fp8" and bucket >= 2)):
        tiles.append(TORCH)
    return list(dict.fromkeys([default, *tiles]))


CANDIDATES: dict[str, tuple[tuple[Tile | str, ...], ...]] = {
    fmt: tuple(tuple(_candidates(fmt, bucket)) for bucket in range(LARGE + 1)) for fmt in FORMATS
}


def split_k(tiles: int, k: int, block_k: int, programs: int) -> tuple[int, int]:
    """-> (splits, K elements per split, a multiple of block_k): split K only while the output's
    `tiles` alone launch fewer than `programs` programs, keeping at least two K blocks a split
    (a split's partial sums cost a write and a read of [rows, BLOCK_N] fp32)."""
    blocks = -(-k // block_k)
    if tiles >= programs or blocks < 4:
        return 1, blocks * block_k
    wanted = min(-(-programs // tiles), blocks // 2)
    per_split = -(-blocks // wanted)
    return -(-blocks // per_split), per_split * block_k


@dataclass
class LayerTiles:
    """One linear layer's skinny-GEMM state: the tile chosen per bucket (the table's default
    until the tuner measures one) and its split-K semaphores."""

    fmt: str
    chosen: dict[int, Tile | str] = field(default_factory=dict)
    _semaphores: dict[torch.device, torch.Tensor] = field(default_factory=dict, repr=False)

    def tile(self, rows: int) -> Tile | str:
        bucket = bucket_of(rows)
        return self.chosen.get(bucket, DEFAULTS[self.fmt][bucket])

    def semaphores(self, device: torch.device) -> torch.Tensor:
        """The layer's zeroed int32 semaphores on `device`, made on first use there (every
        launch leaves them zeroed, so CUDA graphs and eager calls share them)."""
        sems = self._semaphores.get(device)
        if sems is None:
            sems = self._semaphores[device] = torch.zeros(SEMAPHORES, dtype=torch.int32, device=device)
        return sems
