"""CUDA graphs of the detokenizer: one Euler step per DiT bucket, one forward per vocoder shape.

A captured graph replays a fixed sequence of kernels on fixed addresses: the DiT bucket's
static buffers (detok/dit_batch.py) and a static mel input per vocoder (rows, length). All
graphs share one memory pool (only one replays at a time, on the detokenizer worker's stream,
and each result is copied out before the next replay). Capture runs in thread-local mode with
its own side stream, so the LM worker's CUDA work on other threads goes on meanwhile.
A shape not planned (a final chunk's vocoder length) is captured when first met, while serving:
so a capture touches nothing beyond its own stream and pool. `torch.cuda.graph` would first
synchronize the whole device and empty the caching allocator's device and pinned host caches
(memory the other threads' next steps then allocate again, each device free synchronizing);
`capture` calls the graph's capture_begin / capture_end itself instead.
GraphCache is the bookkeeping (lazy capture, least recently used dropped beyond a bound) and
runs anywhere; `AnnouncedCapture` says when a capture begins (the pipeline counts those met
while serving); the capture itself needs CUDA (tests on the CPU pass a stand-in `capture_fn`
that runs the warm-up and replays by calling the body again).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import torch
from torch import Tensor

from kimiaudio.detok.dit_batch import DiTBatch

V = TypeVar("V")


class GraphCache(Generic[V]):
    """Values (captured graphs) by key, made on first use; beyond `capacity` the least
    recently used one is dropped (and made again if it comes back)."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"graph cache capacity {capacity}: expected >= 1")
        self.capacity = capacity
        self.num_captured = 0
        self._values: OrderedDict[Hashable, V] = OrderedDict()

    def get(self, key: Hashable, make: Callable[[], V]) -> V:
        if key in self._values:
            self._values.move_to_end(key)
            return self._values[key]
        value = make()
        self.num_captured += 1
        self._values[key] = value
        while len(self._values) > self.capacity:
            self._values.popitem(last=False)
        return value

    def __contains__(self, key: Hashable) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)


def capture(body: Callable[[], None], pool, stream: torch.cuda.Stream, warmup: int = 2) -> torch.cuda.CUDAGraph:
    """Run `body` `warmup` times on `stream` (lazy inits, cuBLAS workspaces), then capture it
    there, into `pool`; the caller's stream waits for both."""
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            body()
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            body()
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    return graph


class AnnouncedCapture:
    """A capture function that first tells `on_capture` (when set) that a capture begins."""

    def __init__(self, capture_fn: Callable[..., torch.cuda.CUDAGraph]):
        self.capture_fn = capture_fn
        self.on_capture: Callable[[], None] | None = None

    def __call__(self, body: Callable[[], None], pool, stream) -> torch.cuda.CUDAGraph:
        if self.on_capture is not None:
            self.on_capture()
        return self.capture_fn(body, pool, stream)


class DiTStepGraphs:
    """FlowMatcher's `run_step` on CUDA: replay the bucket's captured Euler step."""

    def __init__(self, pool, stream: torch.cuda.Stream | None, capacity: int = 256, capture_fn=capture):
        self.pool, self.stream, self.capture_fn = pool, stream, capture_fn
        self.cache: GraphCache[torch.cuda.CUDAGraph] = GraphCache(capacity)

    def capture(self, batch: DiTBatch) -> None:
        """Capture the bucket's step now; the warm-up calls move x, which is put back."""
        self.cache.get(batch.shape, lambda: self._capture(batch))

    def _capture(self, batch: DiTBatch) -> torch.cuda.CUDAGraph:
        saved = batch.x.clone()
        graph = self.capture_fn(batch.step, self.pool, self.stream)
        batch.x.copy_(saved)
        return graph

    def __call__(self, batch: DiTBatch) -> None:
        self.cache.get(batch.shape, lambda: self._capture(batch)).replay()


class VocoderGraphs:
    """VocoderBatcher's `forward` on CUDA: mel [B, num_mels, T] -> wav [B, T * hop] by
    replaying the graph of (B, T) on its static input; the output is copied out."""

    def __init__(self, vocoder, pool, stream: torch.cuda.Stream | None, capacity: int = 64, capture_fn=capture):
        self.vocoder, self.pool, self.stream, self.capture_fn = vocoder, pool, stream, capture_fn
        self.cache: GraphCache[tuple[Tensor, list[Tensor], torch.cuda.CUDAGraph]] = GraphCache(capacity)

    def capture(self, shape: tuple[int, ...]) -> None:
        self.cache.get(shape, lambda: self._capture(shape))

    def _capture(self, shape: tuple[int, ...]) -> tuple[Tensor, list[Tensor], torch.cuda.CUDAGraph]:
        param = next(self.vocoder.parameters())
        mel = torch.zeros(shape, dtype=param.dtype, device=param.device)  # outside the pool: ours
        out: list[Tensor] = []  # the captured call's output [B, T * hop], in the graph pool

        def body():
            out[:] = [self.vocoder(mel)[:, 0]]

        graph = self.capture_fn(body, self.pool, self.stream)
        return mel, out, graph

    def __call__(self, mel: Tensor) -> Tensor:
        static_mel, out, graph = self.cache.get(tuple(mel.shape), lambda: self._capture(tuple(mel.shape)))
        static_mel.copy_(mel)
        graph.replay()
        return out[0].clone()  # the pool is shared: the next replay may reuse this memory
