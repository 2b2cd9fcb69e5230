"""The device path: the CPU suite's main checks again, on a CUDA GPU (skipped without one).

`python -m pytest tests/test_gpu.py` on a machine with a GPU is the first thing to run there
(with tests/test_triton_attention.py: the kernels against their torch references).
KIMIAUDIO_TEST_DEVICE picks the device (default cuda). `KIMIAUDIO_TEST_DEVICE=cpu` runs the
tests that mean something on the CPU too (how this file was checked without a GPU); the
CUDA-only ones (pool sizing from free memory, features kept off the GPU, CUDA graphs) then
skip. On CUDA the engine decodes through CUDA graphs and the Triton kernels by default; the
graph tests compare that with eager steps (same kernels), with the torch path and with the
batch-1 reference loop.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading

import pytest
import torch

from kimiaudio.checkpoint.paths import resolve_device
from kimiaudio.config import EngineConfig, load_config
from kimiaudio.engine.llm_engine import LLMEngine
from kimiaudio.engine.mixed_batch import MixedInputs
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.layers.precision import exact_float32
from kimiaudio.layers.triton_support import kernel_mode
from kimiaudio.pipeline.encode_cache import EncodeCache
from kimiaudio.pipeline.model_stack import ModelStack
from kimiaudio.pipeline.turn_request import TurnRequest
from kimiaudio.pipeline.worker import NORMAL, URGENT, Worker

from helpers.bench_checks import check_small_decode_bench
from helpers.engine_scenarios import (
    build_requests,
    check_bfloat16_engine,
    golden_prompt,
    load_tiny_lm,
    make_request,
    reference_steps,
    run_scenario,
)
from helpers.lm_golden import SECTIONS, TOL, forward_logits
from helpers.pipeline_turns import run_turn, with_pipeline

_NAME = os.environ.get("KIMIAUDIO_TEST_DEVICE", "cuda")
# Resolved as model.device is (cuda -> cuda:N), where it can be: torch.cuda calls get an index.
DEVICE = resolve_device(_NAME) if _NAME == "cpu" or torch.cuda.is_available() else torch.device(_NAME)
pytestmark = pytest.mark.skipif(
    DEVICE.type == "cuda" and not torch.cuda.is_available(),
    reason="needs a CUDA GPU (KIMIAUDIO_TEST_DEVICE=cpu runs these on the CPU)",
)
cuda_only = pytest.mark.skipif(DEVICE.type != "cuda", reason="means something on CUDA only")


@pytest.fixture(autouse=True, scope="module")
def _exact_float32():
    """The fp32 comparisons in float32, as a float32 stack's load sets it (no TF32)."""
    exact_float32(DEVICE, torch.float32)


@pytest.mark.parametrize("section", SECTIONS)
def test_full_prompt_forward_matches_golden_on_device(golden_checkpoint, golden, section):
    text_logits, audio_logits = forward_logits(load_tiny_lm(golden_checkpoint, DEVICE), golden, section)
    torch.testing.assert_close(text_logits, golden[f"{section}.forward.text_logits"][0], **TOL)
    torch.testing.assert_close(audio_logits, golden[f"{section}.forward.audio_logits"][0], **TOL)


def test_engine_equals_reference_loop_on_device_in_fp32(golden_checkpoint, golden, golden_rules):
    # Greedy, sampled, penalised, text and fixed-length requests, a pool small enough to preempt,
    # chunked prefill: token for token what the batch-1 loop gives one request at a time.
    lm = load_tiny_lm(golden_checkpoint, DEVICE)
    requests = [req for _, req in build_requests(lm, golden, golden_rules) if not req.request_id.startswith("abort")]
    expected = {req.request_id: reference_steps(lm, req) for req in requests}
    config = EngineConfig(block_size=8, num_kv_blocks=12, max_num_batched_tokens=24, max_num_seqs=8)
    engine = LLMEngine(lm, config, DEVICE, torch.float32)
    outputs = {req.request_id: [] for req in requests}
    reasons = {}
    for req in requests:
        engine.add_request(req)
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            outputs[out.request_id].append((out.text_token, out.audio_token))
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    for rid, (steps, reason) in expected.items():
        assert outputs[rid] == steps, rid
        assert reasons[rid] == reason, rid
    assert engine.stats().num_preemptions > 0
    assert engine.stats().num_blocks_free == 12


@contextlib.contextmanager
def torch_kernels():
    """The torch reference path everywhere (no Triton kernel, hence no CUDA graphs)."""
    saved = os.environ.get("KIMIAUDIO_KERNELS")
    os.environ["KIMIAUDIO_KERNELS"] = "torch"
    kernel_mode.cache_clear()
    try:
        yield
    finally:
        if saved is None:
            del os.environ["KIMIAUDIO_KERNELS"]
        else:
            os.environ["KIMIAUDIO_KERNELS"] = saved
        kernel_mode.cache_clear()


def test_bfloat16_engine_on_device(monkeypatch, golden_checkpoint, golden, golden_rules):
    # The torch path in bf16 (the check records its additive decode masks, which the kernel
    # path has none of); the kernels' bf16 path: test_graphs_in_bfloat16... below.
    with torch_kernels():
        check_bfloat16_engine(DEVICE, monkeypatch, golden_checkpoint, golden, golden_rules)


def graph_config(**overrides) -> EngineConfig:
    return EngineConfig(
        **{
            **dict(block_size=8, num_kv_blocks=40, max_num_batched_tokens=24, max_num_seqs=8, max_model_len=256),
            **overrides,
        }
    )


def padded_like(eager: LLMEngine, graphs: LLMEngine) -> LLMEngine:
    """`eager` (no graphs) over the shapes the graphs of `graphs` were captured for: its decode
    steps padded to their batch sizes, its mixed steps to their token buckets."""
    runner, config = eager.runner, eager.config
    runner.decode_inputs.batch_sizes = graphs.runner.graphs.batch_sizes
    if graphs.runner.mixed_graphs is not None:
        with torch.inference_mode():
            runner.mixed_inputs = MixedInputs(
                runner.pool,
                runner.decode_inputs.max_batch,
                graphs.runner.mixed_graphs.batch_sizes,
                config.max_model_len,
                eager.lm.config.kimia_adaptor_input_dim,
                eager.dtype,
                runner.use_kernels,
            )
    return eager


def golden_scenario(golden_checkpoint, golden, golden_rules):
    """The tiny golden LM on the device and the engine scenario's requests (test_engine_e2e)."""
    lm = load_tiny_lm(golden_checkpoint, DEVICE)
    return lm, build_requests(lm, golden, golden_rules)


@cuda_only
def test_graphs_equal_eager_and_reference_in_fp32(golden_checkpoint, golden, golden_rules):
    # The golden scenario (chunked prefill, preemption-free pool of 40 blocks, aborts, mixed
    # lengths, sampled and penalised requests): graphs, eager steps over the same padded
    # buffers, and the batch-1 reference loop agree token for token.
    lm, arrivals = golden_scenario(golden_checkpoint, golden, golden_rules)
    graphs = LLMEngine(lm, graph_config(), DEVICE, torch.float32)
    assert graphs.runner.graphs is not None and graphs.runner.use_kernels
    assert graphs.runner.graphs.batch_sizes == [1, 2, 4, 8] and graphs.runner.capture_seconds > 0
    replays = []
    replay = graphs.runner.graphs.replay
    graphs.runner.graphs.replay = lambda padded: replays.append(padded) or replay(padded)
    with_graphs = run_scenario(graphs, arrivals)
    assert len(replays) > 20 and set(replays) > {1}
    eager = LLMEngine(lm, graph_config(cuda_graphs=False), DEVICE, torch.float32)
    assert eager.runner.graphs is None
    assert run_scenario(padded_like(eager, graphs), arrivals) == with_graphs  # the graphs' shapes, eagerly
    outputs, finished = with_graphs
    for _, req in arrivals:
        rid = req.request_id
        if rid.startswith("abort") or rid == "fixed-length":
            continue
        steps, reason = reference_steps(lm, req)
        assert (outputs[rid], finished[rid]) == (steps, reason), rid


@cuda_only
def test_mixed_graphs_equal_eager_steps_in_fp32(golden_checkpoint, golden, golden_rules):
    # Mixed steps (prefill chunks beside decodes) replayed from the graphs of their token
    # buckets (16 and 24 tokens: max_num_batched_tokens) give the tokens of eager flat steps
    # (the same prefill kernel, unpadded), as of the batch-1 reference loop (the test above).
    lm, arrivals = golden_scenario(golden_checkpoint, golden, golden_rules)
    engine = LLMEngine(lm, graph_config(), DEVICE, torch.float32)
    graphs = engine.runner.mixed_graphs
    assert graphs is not None and graphs.batch_sizes == [16, 24] and graphs.memory_bytes > 0
    replays = []
    replay = graphs.replay
    graphs.replay = lambda bucket: replays.append(bucket) or replay(bucket)
    with_graphs = run_scenario(engine, arrivals)
    assert len(replays) > 5 and set(replays) == {16, 24}
    eager = LLMEngine(lm, graph_config(mixed_cuda_graphs=False), DEVICE, torch.float32)
    assert eager.runner.mixed_graphs is None and eager.runner.graphs is not None
    assert run_scenario(eager, arrivals) == with_graphs


@cuda_only
@pytest.mark.parametrize("weights", ["int8", "fp8"])
def test_quantized_graphs_equal_eager(golden_checkpoint, golden, golden_rules, weights):
    # The int8 Triton GEMM and fp8's per-token quantization + _scaled_mm inside the captured
    # decode graphs: replaying them gives what eager steps over the same buffers give.
    from kimiaudio.layers.fp8 import fp8_supported
    from kimiaudio.models.quantize import quantize_lm

    if weights == "fp8" and not fp8_supported(DEVICE):
        pytest.skip("fp8 needs compute capability 8.9+")
    lm, arrivals = golden_scenario(golden_checkpoint, golden, golden_rules)
    quantize_lm(lm, weights)
    graphs = LLMEngine(lm, graph_config(), DEVICE, torch.float32)
    assert graphs.runner.graphs is not None
    with_graphs = run_scenario(graphs, arrivals)
    eager = LLMEngine(lm, graph_config(cuda_graphs=False), DEVICE, torch.float32)
    assert run_scenario(padded_like(eager, graphs), arrivals) == with_graphs


@cuda_only
def test_kernels_equal_torch_path_in_fp32(golden_checkpoint, golden, golden_rules):
    lm, arrivals = golden_scenario(golden_checkpoint, golden, golden_rules)
    engine = LLMEngine(lm, graph_config(), DEVICE, torch.float32)
    assert engine.runner.use_kernels
    with_kernels = run_scenario(engine, arrivals)
    with torch_kernels():
        engine = LLMEngine(lm, graph_config(), DEVICE, torch.float32)
        assert not engine.runner.use_kernels and engine.runner.graphs is None
        assert run_scenario(engine, arrivals) == with_kernels


@cuda_only
def test_graphs_in_bfloat16_replay_on_another_thread_and_stream(golden_checkpoint, golden, golden_rules):
    # Captured here, replayed by a worker thread on its own stream (as the pipeline's LM
    # worker does): the same tokens as eager steps over the same padded shapes, with each
    # decode step launched from the previous one's samples on the device and without.
    lm = load_tiny_lm(golden_checkpoint, DEVICE, torch.bfloat16)
    tensors, rules = golden, golden_rules
    sections = ("lm.both", "lm.text", "lm_e2e")

    def run(engine):
        for i, section in enumerate(sections):
            params = SamplingParams(seed=i, max_new_tokens=16, ignore_eos=True)
            engine.add_request(make_request(str(i), golden_prompt(tensors, section), params, "both", rules))
        outputs = {}
        while engine.has_work():
            for out in engine.step():
                assert out.error is None
                outputs.setdefault(out.request_id, []).append((out.text_token, out.audio_token))
        return outputs

    result = {}
    for overlap in (True, False):
        graphs = LLMEngine(lm, graph_config(overlap_steps=overlap), DEVICE, torch.bfloat16)
        assert graphs.runner.graphs is not None

        def worker(engine=graphs, key=overlap):
            with torch.cuda.stream(torch.cuda.Stream(DEVICE)):
                result[key] = run(engine)

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        assert graphs.stats().num_blocks_free == 40
    expected = run(padded_like(LLMEngine(lm, graph_config(cuda_graphs=False), DEVICE, torch.bfloat16), graphs))
    assert result[True] == result[False] == expected and all(len(v) == 16 for v in expected.values())


def roomy_config(demo_checkpoint, **engine):
    """The demo checkpoint on the device with a KV pool that only the device bounds (so many
    sequences of so many positions that what the plan leaves is the limit), eager decode."""
    return load_config(
        None,
        {
            "model": {"path": str(demo_checkpoint), "device": str(DEVICE)},
            "engine": {"max_model_len": 65536, "max_num_seqs": 4096, "cuda_graphs": False, **engine},
        },
    )


@cuda_only
def test_a_second_pipeline_gets_the_planned_pool_too(demo_checkpoint):
    """The pool is the memory plan's, and a stopped pipeline gives it back: the next one in the
    same process (as a bench builds one a row) gets the same plan's blocks, not what the first
    one left free."""
    import asyncio

    from kimiaudio.pipeline.pipeline import Pipeline

    stack = ModelStack.load(roomy_config(demo_checkpoint))
    pools = []
    for _ in range(2):
        pipeline = Pipeline(stack, stack.config)
        assert pipeline.memory["kv_pool_source"] == "what is left" and pipeline.memory["on_gpu"]
        pools.append(pipeline.engine.runner.num_blocks)
        # At most the plan's: a test process holds more outside the allocator than the plan's
        # CUDA context (2 GiB more on an H200, after the earlier tests' kernels and libraries
        # were loaded), and the pool is bounded by what the device has free.
        assert 0 < pools[-1] <= pipeline.memory["kv_blocks"]
        asyncio.run(_start_and_stop(pipeline))
    # Within 1%: the first pipeline gave its pool back before the second sized its own.
    assert abs(pools[0] - pools[1]) <= pools[0] // 100


async def _start_and_stop(pipeline):
    await pipeline.start()
    await pipeline.stop()


@cuda_only
def test_pool_sized_under_a_process_cap_stays_inside_it(demo_checkpoint):
    """bench --card-gib caps the process (set_per_process_memory_fraction); the driver's free
    memory still counts the whole card, so a pool sized from it alone would fail to allocate:
    the plan sizes it from the cap."""
    from kimiaudio.layers.device_memory import GIB, cap_process, capacity_bytes, free_bytes
    from kimiaudio.pipeline.pipeline import Pipeline

    stack = ModelStack.load(roomy_config(demo_checkpoint))
    gc.collect()
    torch.cuda.empty_cache()
    cap = torch.cuda.memory_reserved(DEVICE) + 4 * GIB  # 4 GiB beyond what this process holds
    try:
        cap_process(DEVICE, cap / GIB)
        assert abs(capacity_bytes(DEVICE) - cap) < 1 << 20
        assert free_bytes(DEVICE) <= 4 * GIB + (1 << 20)
        pipeline = Pipeline(stack, stack.config)  # uncapped, the plan would fill the card
        assert pipeline.memory["device_total"] == capacity_bytes(DEVICE)
        assert pipeline.engine.runner.num_blocks == pipeline.memory["kv_blocks"] > 0
        assert torch.cuda.memory_reserved(DEVICE) <= cap
        pipeline.engine.release()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, DEVICE)
        gc.collect()
        torch.cuda.empty_cache()


@cuda_only
@pytest.mark.parametrize("weights", ["int8", "fp8"])
def test_quantized_load_peaks_at_one_layer_beyond_the_model(golden_checkpoint, weights):
    """load_lm assembles layer by layer: the device's peak while loading is the finished
    quantized model plus about one decoder layer in bf16 (its fused copies and the
    quantizer's fp32 rows included), never the bf16 model."""
    from kimiaudio.checkpoint.paths import find_checkpoint
    from kimiaudio.layers.fp8 import fp8_supported
    from kimiaudio.models.kimia_lm import load_lm

    if weights == "fp8" and not fp8_supported(DEVICE):
        pytest.skip("fp8 weights need compute capability 8.9+")
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize(DEVICE)
    base = torch.cuda.memory_allocated(DEVICE)
    torch.cuda.reset_peak_memory_stats(DEVICE)
    lm = load_lm(find_checkpoint(golden_checkpoint), DEVICE, torch.bfloat16, weights=weights)
    model = sum(t.numel() * t.element_size() for t in lm.state_dict().values())
    layer = lm.model.layers[0]
    layer_bf16 = 2 * sum(t.numel() for n, t in layer.state_dict().items() if not n.endswith("scale"))
    bf16_model = 2 * sum(t.numel() for n, t in lm.state_dict().items() if not n.endswith("scale"))
    peak = torch.cuda.max_memory_allocated(DEVICE) - base
    # One layer in bf16, its fused q/k/v and gate/up beside the parts while they are joined, and
    # the quantizer's temporaries (abs, fp32 copy, scaled copy) of at most 4,096 rows at once.
    assert peak <= model + 6 * layer_bf16 + (1 << 20), (peak, model, layer_bf16, bf16_model)


@cuda_only
def test_quantized_dit_load_moves_one_block_at_a_time(golden_checkpoint):
    """load_dit moves the DiT block by block, each quantized before the next moves: the
    device's peak is the finished DiT plus about one block in bf16 and its temporaries."""
    from kimiaudio.models.dit import load_dit

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize(DEVICE)
    base = torch.cuda.memory_allocated(DEVICE)
    torch.cuda.reset_peak_memory_stats(DEVICE)
    dit = load_dit(golden_checkpoint / "audio_detokenizer", DEVICE, torch.bfloat16, "int8")
    model = sum(t.numel() * t.element_size() for t in dit.state_dict().values())
    block_bf16 = 2 * sum(t.numel() for n, t in dit.blocks[0].state_dict().items() if not n.endswith("scale"))
    peak = torch.cuda.max_memory_allocated(DEVICE) - base
    assert peak <= model + 6 * block_bf16 + (1 << 20), (peak, model, block_bf16)


def test_pipeline_turn_on_device(demo_checkpoint, speech_16k, monkeypatch):
    cached = []
    put = EncodeCache.put
    monkeypatch.setattr(EncodeCache, "put", lambda self, key, value: (cached.append(value), put(self, key, value)))
    config = load_config(
        None, {"model": {"path": str(demo_checkpoint), "device": str(DEVICE)}, "engine": {"num_kv_blocks": 256}}
    )
    stack = ModelStack.load(config)
    assert stack.lm.device.type == DEVICE.type

    async def body(pipeline):
        turn = await run_turn(pipeline, TurnRequest("c", [], speech_16k, SamplingParams(seed=3, max_new_tokens=60)))
        return turn, pipeline.stats()

    turn, stats = with_pipeline(stack, body)
    assert turn["done"].status == "completed", turn["done"]
    assert turn["text"] == turn["done"].text and turn["pcm"].size > 0 and abs(turn["pcm"]).max() <= 1.0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    if DEVICE.type == "cuda":
        assert cached and all(features.device.type == "cpu" for _, features in cached)  # history cache off the GPU


# On the CPU this is test_bench.py's test_random_weight_decode_bench_runs_on_a_small_shape,
# which CI runs anyway: here it runs where it differs from that, with graphs and kernels.
@cuda_only
def test_random_weight_decode_bench_on_device(capsys):
    check_small_decode_bench(str(DEVICE), capsys)


@cuda_only
def test_workers_run_on_their_own_streams_of_the_priority_asked():
    """The LM worker's stream is the urgent one: its decode kernels start before queued
    detokenizer kernels (worker.URGENT)."""
    workers = [Worker(f"w{priority}", DEVICE, 0, stream_priority=priority) for priority in (URGENT, NORMAL)]
    for worker in workers:
        worker.start()
    try:
        streams = [worker.call(lambda: torch.cuda.current_stream()).result(timeout=30) for worker in workers]
    finally:
        for worker in workers:
            worker.stop(timeout=30)
    urgent, normal = streams
    assert urgent != normal and torch.cuda.default_stream(DEVICE) not in streams
    assert urgent.priority < normal.priority == 0
