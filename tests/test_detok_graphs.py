"""The graph path's bookkeeping on the CPU: lazy capture, LRU bound, prepare_for_serving, and
replays through static buffers equal to the eager path. A stand-in `capture` runs the warm-up
calls and replays by calling the captured body again (tests/test_gpu_detok.py does it for real)."""

from types import SimpleNamespace

import pytest
import torch

from kimiaudio.checkpoint.paths import find_checkpoint
from kimiaudio.config import DetokConfig
from kimiaudio.detok.detokenizer import Detokenizer
from kimiaudio.detok.dit_vocoder_graphs import GraphCache

from helpers.detok_reference import streamed_samples

TOL = dict(atol=1e-4, rtol=1e-4)
SMALL = DetokConfig(
    first_chunk_tokens=4,
    first_look_ahead_tokens=1,
    first_ode_steps=3,
    chunk_tokens=4,
    chunk_growth=1.5,
    max_chunk_tokens=6,
    look_ahead_tokens=2,
    ode_steps=4,
    min_ode_steps=2,
    max_kv_cache_frames=40,
    max_batch_sessions=2,
)


def test_graph_cache_is_lazy_and_bounded():
    made = []
    cache = GraphCache(capacity=2)

    def get(key):
        return cache.get(key, lambda: made.append(key) or f"graph {key}")

    assert get("a") == "graph a" and get("b") == "graph b" and get("a") == "graph a"
    assert made == ["a", "b"]
    get("c")  # over capacity: the least recently used ("b") goes
    assert "b" not in cache and "a" in cache and len(cache) == 2
    get("b")
    assert made == ["a", "b", "c", "b"] and cache.num_captured == 4
    with pytest.raises(ValueError, match="capacity"):
        GraphCache(0)


class StandInCapture:
    """Runs the warm-up like dit_vocoder_graphs.capture; replay calls the body again."""

    def __init__(self):
        self.captured = 0

    def __call__(self, body, pool, stream, warmup=2):
        for _ in range(warmup):
            body()
        self.captured += 1
        return SimpleNamespace(replay=body)


@pytest.fixture(scope="module")
def detoks(golden_checkpoint):
    eager = Detokenizer.load(find_checkpoint(golden_checkpoint), "cpu", torch.float32, SMALL)
    capture = StandInCapture()
    graphed = Detokenizer(eager.dit, eager.vocoder, SMALL, capture_fn=capture)
    return eager, graphed, capture


def test_cpu_prepare_for_serving_does_nothing(detoks):
    eager, _, _ = detoks
    info = eager.prepare_for_serving()
    assert info["cuda_graphs"] is False and info["dit_graphs"] == 0 and info["vocoder_graphs"] == 0


@torch.inference_mode()
def test_graph_path_equals_eager(detoks, golden_checkpoint):
    eager, graphed, capture = detoks
    announced = []
    graphed.graph_capture.on_capture = lambda: announced.append(capture.captured)  # told before each capture
    info = graphed.prepare_for_serving()
    assert info["cuda_graphs"] and info["dit_graphs"] == capture.captured - info["vocoder_graphs"]
    assert info["dit_graphs"] == len(graphed.dit_graphs.cache) > 0
    planned = capture.captured
    assert announced == list(range(planned))
    announced.clear()
    g = torch.Generator().manual_seed(4)
    vocab = eager.dit.cfg.semantic_vocab_size
    streams = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (23, 9, 31)]
    detok_streams = {
        name: [d.new_stream(seed=s) for s in range(3)] for name, d in (("eager", eager), ("graphed", graphed))
    }
    for detok_stream in detok_streams["eager"]:
        detok_stream.trace = []
    out = {name: [[] for _ in streams] for name in detok_streams}
    for step in range(0, 32, 5):  # 5 tokens a step; a stream ends with a final flush
        for name, detok in (("eager", eager), ("graphed", graphed)):
            items = [
                (detok_streams[name][i], toks[step : step + 5], step + 5 >= len(toks))
                for i, toks in enumerate(streams)
                if step < len(toks)
            ]
            for (i, _), wav in zip([(i, t) for i, t in enumerate(streams) if step < len(t)], detok.step_batch(items)):
                out[name][i].append(wav)
    for a, b, detok_stream in zip(out["eager"], out["graphed"], detok_streams["eager"]):
        wa, wb = torch.cat(a), torch.cat(b)
        assert wa.numel() == streamed_samples(golden_checkpoint, detok_stream.trace)
        torch.testing.assert_close(wb, wa, **TOL)
    # final chunks' vocoder lengths were not planned: captured when first met, each announced
    assert capture.captured > planned
    assert announced == list(range(planned, capture.captured))
    graphed.graph_capture.on_capture = None
