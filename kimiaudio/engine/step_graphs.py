"""CUDA graphs of a static-shape step, captured once at start-up: the all-decode step (one per
padded batch size, decode_batch.py) and the mixed step (one per token bucket, mixed_batch.py).

Follows nano-vllm's ModelRunner.capture_cudagraph: largest batch first, every graph in one
shared memory pool (a smaller batch's activations fit in the blocks the larger one freed),
one eager warm-up run before each capture (Triton compiles its kernels and cuBLAS picks its
algorithms outside the capture). A graph replays the whole forward (embeddings, every trunk
and MIMO layer, both heads; the decode step's also samples, graph_sampling.py) over the static
buffers, which the caller rewrites before each replay; its outputs (the logits, the decode
step's samples) stay in the tensors the capture produced.

Replay runs on the caller's current CUDA stream: a worker thread with its own stream may
replay graphs captured on another thread, as long as it writes the static buffers on that
same stream first (DecodeInputs.prepare does: copies are issued on the current stream).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

Outputs = tuple[torch.Tensor, ...]  # what the forward returns: text, audio logits [Bp, V] (, samples)


class StepGraphs:
    def __init__(
        self, forward: Callable[[int], Outputs], batch_sizes: list[int], device: torch.device, what: str = "decode step"
    ):
        """forward(padded): the step's forward over the first `padded` rows of the static buffers."""
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self.forward = forward
        self.batch_sizes = list(batch_sizes)
        self.device = device
        self.what = what
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, Outputs] = {}
        self.capture_seconds = 0.0
        self.memory_bytes = 0  # device memory the graphs' private pool holds (their logits included)

    @torch.inference_mode()
    def capture(self) -> None:
        sizes = sorted(self.batch_sizes, reverse=True)
        log.info(
            "capturing CUDA graphs of the %s for %d sizes (%s)...",
            self.what,
            len(sizes),
            ", ".join(map(str, reversed(sizes))),
        )
        torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        pool, before = None, torch.cuda.memory_reserved(self.device)
        for size in sizes:
            self.forward(size)  # warm-up
            if size == sizes[0]:
                # What the allocator holds before the captures add their private pool. Each
                # capture begins by emptying the allocator's cache (torch.cuda.graph does), so
                # the baseline is taken with it emptied too: otherwise the cached warm-up
                # activations, and whatever else was cached, are subtracted from the pool's
                # size, which can come out negative. The driver's free memory is no measure
                # of it either: it does not move while the allocator has cached segments.
                torch.cuda.synchronize(self.device)
                torch.cuda.empty_cache()
                before = torch.cuda.memory_reserved(self.device)
            graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's CUDA calls (a server's other worker) may go on
            # during the capture without invalidating it.
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                self.outputs[size] = self.forward(size)
            pool = graph.pool() if pool is None else pool
            self.graphs[size] = graph
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.perf_counter() - start
        self.memory_bytes = torch.cuda.memory_reserved(self.device) - before
        log.info(
            "captured CUDA graphs of the %s for %d sizes in %.1f s, %.2f GiB",
            self.what,
            len(sizes),
            self.capture_seconds,
            self.memory_bytes / 2**30,
        )

    def replay(self, padded: int) -> Outputs:
        """Run the graph of this padded size over the buffers' current contents -> its outputs
        (tensors of the graph's own, rewritten by its next replay)."""
        self.graphs[padded].replay()
        return self.outputs[padded]
