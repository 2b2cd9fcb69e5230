"""`bench --trace DIR` (bench/pipeline_trace.py): a row's first seconds under torch.profiler,
written as a gzipped Chrome trace, and summarized per CUDA stream (per thread on the CPU)."""

from __future__ import annotations

import gzip
import json

from kimiaudio.bench.pipeline_trace import summarize, write_gzipped

from helpers.cli import assert_one_line_error, kimiaudio


def test_a_traced_row_writes_its_trace_and_a_summary(demo_checkpoint, tmp_path):
    out = tmp_path / "traces"  # made by the bench
    result = kimiaudio(
        "bench", "--model", str(demo_checkpoint), "--sessions", "2", "--turns", "1", "--max-new-tokens", "8",
        "--no-reference", "--json", "--trace", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["rows"]
    trace = row["trace"]
    assert trace["file"] == str(out / "trace-2.json.gz") and trace["of"] == "cpu threads (no GPU)"
    assert 0 < trace["seconds"]  # (how long depends on the machine's load: no bound asserted)
    events = json.loads(gzip.decompress((out / "trace-2.json.gz").read_bytes()))["traceEvents"]
    assert any(e.get("name") == "aten::linear" for e in events)
    # The workers' threads were recorded, not only the event loop's that started the profiler:
    # the LM worker's encoders and engine, and the detokenizer's vocoder.
    names = {top["name"] for place in trace["places"] for top in place["top"]}
    assert len(trace["places"]) >= 2 and "aten::conv_transpose1d" in names, trace
    assert all(0 < p["busy_ms"] and 0 < p["busy_share"] <= 1 and p["kernels"] > 0 for p in trace["places"])
    assert 0 < trace["busy_share"] <= 1 and trace["cpu_operators_written"] is True


def test_a_trace_too_large_keeps_the_device_events_only(tmp_path):
    events = [{"cat": "cpu_op", "name": f"aten::op{i}", "ts": i, "dur": 1} for i in range(2000)]
    events += [{"cat": "kernel", "name": "gemm", "ts": 5, "dur": 3}, {"cat": "cuda_runtime", "name": "cudaLaunch"}]
    trace = json.dumps({"traceEvents": events}).encode()
    path = tmp_path / "t.json.gz"
    assert write_gzipped(trace, path) is False
    assert len(json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]) == 2002
    assert write_gzipped(trace, path, limit=len(gzip.compress(trace)) - 1) is True
    kept = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    assert [e["cat"] for e in kept] == ["kernel", "cuda_runtime"]


def test_the_summary_counts_overlapping_kernels_once():
    events = [  # (stream, name, start us, duration us)
        (7, "gemm", 0.0, 400.0),
        (7, "gemm", 300.0, 200.0),  # overlaps the first on its stream: 500 us busy in all
        (13, "dit", 450.0, 250.0),  # another stream: the GPU busy 700 us of the window
    ]
    summary = summarize(events, window_s=0.001, on_gpu=True, path="t.json.gz")
    assert summary["of"] == "cuda streams" and summary["busy_share"] == 0.7
    first, second = summary["places"]
    assert (first["id"], first["busy_ms"], first["busy_share"], first["kernels"]) == (7, 0.5, 0.5, 2)
    assert first["top"] == [{"name": "gemm", "ms": 0.6}]  # kernel time, summed
    assert (second["id"], second["busy_ms"]) == (13, 0.25)


def test_trace_goes_with_the_pipeline_bench_and_a_writable_directory(tmp_path):
    result = kimiaudio("bench", "--random-weights", "7b", "--trace", str(tmp_path))
    assert_one_line_error(result, "--trace goes with the pipeline bench")
    a_file = tmp_path / "file"
    a_file.write_text("")
    result = kimiaudio("bench", "--trace", str(a_file / "sub"))
    assert_one_line_error(result, f"--trace {a_file / 'sub'}: cannot write there")
