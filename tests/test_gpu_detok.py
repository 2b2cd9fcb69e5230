"""The detokenizer's device path: CUDA graphs = eager, the official goldens, the full-size bf16
DiT + vocoder with timings, the random full stack's memory plan (skipped without a GPU).

`python -m pytest -q -s tests/test_gpu_detok.py` on the GPU machine prints the timings.
KIMIAUDIO_TEST_DEVICE=cpu runs the same tests on the CPU (graphs replaced by a stand-in
capture, the full shapes by the tiny ones): how this file was checked without a GPU.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from kimiaudio.bench.random_stack import build_random_stack
from kimiaudio.checkpoint.paths import find_checkpoint, resolve_device
from kimiaudio.config import DetokConfig, load_config
from kimiaudio.detok.detokenizer import Detokenizer, DetokItem
from kimiaudio.layers.precision import exact_float32
from kimiaudio.pipeline.memory_plan import plan_stack
from kimiaudio.pipeline.memory_report import format_memory_plan

from helpers.detok_reference import streamed_samples

_NAME = os.environ.get("KIMIAUDIO_TEST_DEVICE", "cuda")
# Resolved as model.device is (cuda -> cuda:N), where it can be: torch.cuda calls get an index.
DEVICE = resolve_device(_NAME) if _NAME == "cpu" or torch.cuda.is_available() else torch.device(_NAME)
ON_CUDA = DEVICE.type == "cuda"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        ON_CUDA and not torch.cuda.is_available(),
        reason="needs a CUDA GPU (KIMIAUDIO_TEST_DEVICE=cpu runs these on the CPU)",
    ),
]
TOL = dict(atol=1e-4, rtol=1e-4)
SHAPE = "full" if ON_CUDA else "tiny"


def _stand_in_capture(body, pool, stream, warmup=2):
    """cuda_graphs.capture on the CPU: each shape prepared runs once (more warm-up runs, for
    CUDA's lazy inits, would only run the same shape again), and replay runs it again."""
    body()
    return SimpleNamespace(replay=body)


def graphed(dit, vocoder, cfg: DetokConfig) -> Detokenizer:
    """CUDA graphs on CUDA; on the CPU the same path with a stand-in capture."""
    return Detokenizer(dit, vocoder, cfg, capture_fn=None if ON_CUDA else _stand_in_capture)


def eager(dit, vocoder, cfg: DetokConfig) -> Detokenizer:
    from dataclasses import replace

    return Detokenizer(dit, vocoder, replace(cfg, cuda_graphs=False), bucketed=False)


@pytest.fixture(scope="module")
def golden_models(golden_checkpoint):
    exact_float32(DEVICE, torch.float32)  # as a float32 stack's load does: no TF32 convolutions
    d = Detokenizer.load(find_checkpoint(golden_checkpoint), DEVICE, torch.float32, DetokConfig())
    return d.dit, d.vocoder


def _run(
    detok: Detokenizer,
    streams: list[list[int]],
    seeds: list[int] | None = None,
    per_step: int = 5,
    traces: list[list] | None = None,
) -> list[torch.Tensor]:
    """DetokStreams fed `per_step` tokens a step, batched together; each stream's whole wav
    (`traces`: one list per stream, given its chunk records)."""
    detok_streams = [detok.new_stream(seed=s) for s in (seeds or range(len(streams)))]
    for detok_stream, trace in zip(detok_streams, traces or []):
        detok_stream.trace = trace
    pieces = [[] for _ in streams]
    for step in range(0, max(map(len, streams)), per_step):
        live = [i for i, toks in enumerate(streams) if step < len(toks)]
        items = [
            DetokItem(detok_streams[i], streams[i][step : step + per_step], step + per_step >= len(streams[i]))
            for i in live
        ]
        for i, wav in zip(live, detok.step_batch(items)):
            pieces[i].append(wav)
    return [torch.cat(p) for p in pieces]


@torch.inference_mode()
def test_graphs_equal_eager_fp32(golden_models, golden_checkpoint):
    """Streams of different lengths and phases, batched at bucket shapes and replayed from
    graphs, equal each stream run alone eagerly (fp32, 1e-4)."""
    cfg = DetokConfig(first_ode_steps=6, ode_steps=8, min_ode_steps=4, max_batch_sessions=4)
    fast = graphed(*golden_models, cfg)
    info = fast.prepare_for_serving()
    print(f"\nprepare_for_serving (golden checkpoint, fp32): {info}")
    assert info["dit_graphs"] > 0 and info["vocoder_graphs"] > 0
    g = torch.Generator().manual_seed(0)
    vocab = golden_models[0].cfg.semantic_vocab_size
    streams = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (57, 23, 90, 8, 41, 66)]
    together = _run(fast, streams)
    slow = eager(*golden_models, cfg)
    for seed, (stream, wav) in enumerate(zip(streams, together)):
        trace = []
        (alone,) = _run(slow, [stream], [seed], traces=[trace])
        assert wav.numel() == streamed_samples(golden_checkpoint, trace)
        torch.testing.assert_close(wav, alone, **TOL)


@torch.inference_mode()
@pytest.mark.parametrize("name", ["s37", "s75"])
def test_official_preset_matches_goldens_with_graphs(golden, golden_models, name):
    detok = graphed(*golden_models, DetokConfig(preset="official"))
    info = golden[f"detok.{name}.chunk_info"]
    captured = iter(golden[f"detok.{name}.chunk{i}.noise"] for i in range(info.shape[0]))
    wav = detok.detokenize(golden[f"detok.{name}.tokens"], noise_fn=lambda n: next(captured))
    torch.testing.assert_close(wav, golden[f"detok.{name}.wav"][0], **TOL)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    config = load_config(
        None,
        {
            "model": {"device": str(DEVICE), "dtype": "bfloat16" if ON_CUDA else "float32"},
            "storage": {"data_dir": str(tmp_path_factory.mktemp("data"))},
        },
    )
    return build_random_stack(config, SHAPE)


def _steady_streams(detok: Detokenizer, n: int, warm_chunks: int = 6) -> list:
    """n streams past their growing chunks, each with its next (largest) chunk's tokens pushed."""
    detok_streams = [detok.new_stream(seed=i) for i in range(n)]
    codes = detok.dit.cfg.semantic_vocab_size
    rng = np.random.default_rng(0)
    for _ in range(warm_chunks):
        detok.step_batch(
            [DetokItem(s, rng.integers(0, codes, s.next_chunk_tokens).tolist(), False) for s in detok_streams]
        )
    for s in detok_streams:
        s.push(rng.integers(0, codes, s.next_chunk_tokens).tolist())
    return detok_streams


def _time_chunk(detok: Detokenizer, n: int, first: bool) -> tuple[float, list[torch.Tensor]]:
    """Seconds of one step_batch running one chunk for each of n streams (first or later
    chunks), and the streams' wavs."""
    if first:
        detok_streams = [detok.new_stream(seed=i) for i in range(n)]
        for s in detok_streams:
            s.push([1] * s.next_chunk_tokens)
    else:
        detok_streams = _steady_streams(detok, n)
    start = time.perf_counter()
    wavs = detok.step_batch([DetokItem(s, [], False) for s in detok_streams])
    seconds = time.perf_counter() - start
    assert all(w.numel() > 0 and bool(torch.isfinite(w).all()) for w in wavs)
    return seconds, wavs


@torch.inference_mode()
def test_full_size_detokenizer_graphed_and_timed(stack):
    """The real DiT and vocoder shapes (bf16 on CUDA): graphs captured before serving, then one
    chunk per stream at 1 and 8 streams (first chunks, and later chunks of the largest shape),
    graphed vs eager. On CUDA it prints the numbers (checking that the output is finite); on
    the CPU (tiny shapes, a stand-in capture: times that mean nothing) it runs each once and
    checks that the graph path's audio is the eager path's (fp32)."""
    detok = stack.detokenizer
    info = detok.prepare_for_serving()
    print(f"\n{SHAPE} detokenizer: prepare_for_serving {info}")
    plain = eager(detok.dit, detok.vocoder, detok.cfg)
    for n in (1, 8):
        for first in (True, False):
            wavs = {}
            for name, d in (("graphed", detok), ("eager", plain)):
                if ON_CUDA:
                    _time_chunk(d, n, first)  # warm (lazy captures of unplanned shapes, allocator)
                runs = [_time_chunk(d, n, first) for _ in range(3 if ON_CUDA else 1)]
                times, wavs[name] = sorted(t for t, _ in runs), runs[-1][1]
                print(
                    f"  {name:>7} {n:>2} streams, {'first' if first else 'later'} chunks: "
                    f"{1e3 * times[len(times) // 2]:8.1f} ms per batch "
                    f"({1e3 * times[len(times) // 2] / n:6.1f} ms a stream)"
                )
            if not ON_CUDA:
                for graphed_wav, eager_wav in zip(wavs["graphed"], wavs["eager"], strict=True):
                    torch.testing.assert_close(graphed_wav, eager_wav, **TOL)


@torch.inference_mode()
def test_graphs_on_a_worker_thread_with_its_own_stream(golden_models):
    """As the pipeline runs it: captured and replayed on a worker thread on its own stream while
    another thread keeps the device busy."""
    cfg = DetokConfig(first_ode_steps=4, ode_steps=4, min_ode_steps=2, max_batch_sessions=2)
    results, errors, stop = {}, [], threading.Event()

    def worker():
        try:
            with torch.inference_mode():
                stream = torch.cuda.Stream(DEVICE) if ON_CUDA else None
                with torch.cuda.stream(stream) if ON_CUDA else _nothing():
                    detok = graphed(*golden_models, cfg)
                    detok.prepare_for_serving()
                    results["wavs"] = _run(detok, [list(range(30)), list(range(5, 25))])
        except Exception as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)
        finally:
            stop.set()

    thread = threading.Thread(target=worker)
    thread.start()
    a = torch.randn(512, 512, device=DEVICE)
    while not stop.is_set():  # the "LM thread"
        a = torch.tanh(a @ a)
    thread.join()
    assert not errors, errors
    expected = _run(eager(*golden_models, cfg), [list(range(30)), list(range(5, 25))])
    for got, want in zip(results["wavs"], expected):
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.skipif(not ON_CUDA, reason="the caching allocator is CUDA's")
def test_a_capture_while_serving_keeps_the_allocators_caches():
    """A shape met while serving is captured without emptying the allocator's caches (memory
    the other workers' next steps would allocate again) and replays what it captured."""
    from kimiaudio.detok.dit_vocoder_graphs import capture

    block = torch.empty(64 << 20, dtype=torch.uint8, device=DEVICE)
    del block  # its 64 MiB stay cached by the allocator
    reserved = torch.cuda.memory_reserved(DEVICE)
    x, out = torch.arange(1024.0, device=DEVICE), []
    graph = capture(lambda: out.__setitem__(slice(None), [x * 2]), torch.cuda.graph_pool_handle(), torch.cuda.Stream())
    assert torch.cuda.memory_reserved(DEVICE) >= reserved
    x.fill_(3.0)
    graph.replay()
    torch.cuda.synchronize(DEVICE)
    assert torch.equal(out[0], torch.full_like(x, 6.0))


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_random_stack_memory_plan(stack):
    """The plan of the full-size stack (tiny on the CPU) as served to 64 sessions: on CUDA
    against this card, with its graph pools; the KV pool gets what is left."""
    config = dataclasses.replace(stack.config, server=dataclasses.replace(stack.config.server, max_sessions=64))
    plan = plan_stack(stack, config)
    print("\n" + format_memory_plan(plan))
    if ON_CUDA:
        free, total = torch.cuda.mem_get_info(DEVICE)
        print(
            f"  (device now: {torch.cuda.memory_allocated(DEVICE) / (1 << 30):.2f} GiB allocated, "
            f"{(total - free) / (1 << 30):.2f} GiB in use)"
        )
        assert {"detok_graph_pool", "lm_graph_pool", "cuda_context"} <= set(plan["reserved"])
    assert plan["kv_pool"] > 0 and plan["reserved"]["detok_state"] == 64 * plan["detok_state_per_session"]
