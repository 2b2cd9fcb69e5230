"""The parts of the memory plan that are estimated, not counted, each with its source and margin.

The plan (pipeline/memory_plan.py) counts what shapes decide exactly: weights, the detokenizer's
static buffers and per-session state, the KV pool, the decode graphs' logits. What the CUDA
allocator, the driver and the captured graphs' private pools add beyond that is only known by
measuring on a GPU, so it comes from this table: each entry is a measured ratio (or size)
times (1 + margin). `python -m kimiaudio bench --memory-estimates` measures every entry on a GPU
and prints the values to put here (.ci/gpu-check's `estimates` step writes them to its report).

Measured on one H200 (torch 2.11 + CUDA 13, 2026-11-27, `bench --memory-estimates --sessions
16` at 77b6375; benchmarks/results/h200-2026-11-27/): the random full-size stack, 16-row
detokenizer buckets, decode graphs for batches of 1..64. The two LM graph pools are the largest
any run there logged, measured from a baseline that held the allocator's cache the captures
emptied: each figure is at most the pool's size (engine/step_graphs.py measures from an emptied
cache). Each margin covers what the one measurement cannot: another card's or driver's
allocator rounding and kernels' workspaces.
"""

from __future__ import annotations

from dataclasses import dataclass

from kimiaudio.layers.device_memory import GIB


@dataclass(frozen=True)
class Estimate:
    measured: float  # the ratio or size measured (or assumed, see source)
    margin: float  # added on top: value = measured * (1 + margin)
    per: str  # what `value` multiplies ("bytes": a size in bytes)
    source: str

    @property
    def value(self) -> float:
        return self.measured * (1 + self.margin)


ESTIMATES: dict[str, Estimate] = {
    # The DiT step and vocoder graphs' private pool: their intermediate activations (the largest
    # graph's, reused by the others) and every vocoder graph's output wav. Both grow with the
    # bucket rows and frames, as the static buffers do, so it is a ratio to those.
    "detok_graph_pool": Estimate(
        measured=0.7148,
        margin=0.10,
        per="byte of the detokenizer's static buffers",
        source="H200, 2026-11-27: 1.85 GB beside 2.58 GB of static buffers (16-row buckets)",
    ),
    # The decode graphs' pool: every captured batch size keeps its logits (both heads), and the
    # largest batch's activations are reused by the smaller ones.
    "lm_graph_pool": Estimate(
        measured=1.134,
        margin=0.10,
        per="byte of the decode graphs' logits",
        source="H200, 2026-11-27: 0.21 GiB for batch sizes 1..64, whose logits are 0.199 GB",
    ),
    # The mixed-step graphs (prefill chunks beside decodes, one graph per token bucket): every
    # bucket's logits, a row per sequence of the static batch, and the largest bucket's live
    # tensors, counted; the measured ratio of the decode graphs (allocator rounding of their
    # small outputs) does not carry over to these large ones.
    "lm_mixed_graph_pool": Estimate(
        measured=1.128,
        margin=0.10,
        per="byte of the mixed-step graphs' logits and largest bucket (memory_plan.mixed_graph_bytes)",
        source="H200, 2026-11-27: 0.36 GiB against 0.343 GB counted (token buckets 16..320)",
    ),
    # Tensors alive at once in the largest eager forward (a prefill of max_num_batched_tokens
    # positions, or the speech encoders' largest batch; memory_plan.activation_bytes counts
    # them tensor by tensor in one layer): kernels' temporaries come on top (the allocator's
    # rounding and fragmentation are allocator_slack's).
    "activations": Estimate(
        measured=1.1388,
        margin=0.10,
        per="byte of the largest forward's live tensors (memory_plan.activation_bytes)",
        source="H200, 2026-11-27: the encoders' batch peaked at 1.42 GB against 1.25 GB counted",
    ),
    # Device memory outside torch's allocator: the CUDA context, cuBLAS/cuDNN handles and
    # workspaces, loaded kernel modules (Triton's included).
    "cuda_context": Estimate(
        measured=1_317_863_424,
        margin=0.10,
        per="bytes",
        source="H200, 2026-11-27: 1.32 GB outside the allocator (driver 580, lazy module loading)",
    ),
    # What the caching allocator reserves beyond what is allocated (segment rounding, blocks
    # split and left over between transient tensors of different sizes).
    "allocator_slack": Estimate(
        measured=0.25 * GIB,
        margin=0.0,
        per="bytes",
        source="not measured: a few 2 MiB-rounded segments per worker stream and size class",
    ),
}


def estimate(name: str) -> float:
    return ESTIMATES[name].value
