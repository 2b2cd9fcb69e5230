"""Prometheus view of the pipeline: read at scrape time from `pipeline.metrics` and `stats()`.

A custom collector, so nothing is copied while serving: each scrape turns the pipeline's
Timing histograms (cumulative buckets, bounds = Timing.buckets) into HistogramMetricFamily
samples and its counters and pool state into counters and gauges. Stage timings are seconds
since the turn was submitted (queued_s, encoded_s, prefill_done_s, first_audio_token_s,
first_pcm_s, done_s; see pipeline/metrics.py TURN_STAGES); the server adds the last stage,
commit -> first audio packet sent (server_metrics.py).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from kimiaudio.pipeline.metrics import Timing
from kimiaudio.pipeline.pipeline import Pipeline


def _buckets(timing: Timing) -> tuple[list[tuple[str, float]], float]:
    counts, count, total = timing.snapshot()
    cumulative: list[tuple[str, float]] = []
    running = 0
    for bound, n in zip(timing.buckets, counts):
        running += n
        cumulative.append((repr(float(bound)), running))
    cumulative.append(("+Inf", count))
    return cumulative, total


def _histogram(name: str, doc: str, timing: Timing) -> HistogramMetricFamily:
    buckets, total = _buckets(timing)
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)


class PipelineCollector(Collector):
    def __init__(self, pipeline: Callable[[], Pipeline | None]):
        self._pipeline = pipeline  # the app's pipeline once it has started, else None

    def collect(self):
        pipeline = self._pipeline()
        if pipeline is None:
            return
        m, stats = pipeline.metrics, pipeline.stats()
        yield _histogram(
            "kimiaudio_lm_step_seconds", "One LM engine step (prefill and/or decode of the batch)", m.lm_step_s
        )
        yield _histogram("kimiaudio_lm_batch_size", "Sequences in one LM engine step", m.lm_batch)
        yield _histogram(
            "kimiaudio_encode_batch_seconds", "One speech-encoder batch (Whisper + GLM-4 VQ)", m.encode_batch_s
        )
        yield _histogram(
            "kimiaudio_detok_batch_seconds", "One detokenizer batch (DiT + vocoder, every chunk due)", m.detok_batch_s
        )
        yield _histogram(
            "kimiaudio_gc_pause_seconds", "One garbage collection of the interpreter (every thread waits)", m.gc_pause_s
        )
        stages = HistogramMetricFamily(
            "kimiaudio_turn_stage_seconds", "Seconds from submit until a turn reached the stage", labels=["stage"]
        )
        for stage, timing in m.turn_stage_s.items():
            buckets, total = _buckets(timing)
            stages.add_metric([stage.removesuffix("_s")], buckets, total)
        yield stages
        turns = CounterMetricFamily(
            "kimiaudio_turns", "Pipeline turns (answers) ended, by final status", labels=["status"]
        )
        background = CounterMetricFamily(
            "kimiaudio_background_turns",
            "Background turns (the user's words transcribed) ended, by final status",
            labels=["status"],
        )
        for status in ("completed", "cancelled", "failed"):
            turns.add_metric([status], m.turns.get(status, 0))
            background.add_metric([status], m.background_turns.get(status, 0))
        yield turns
        yield background
        yield CounterMetricFamily("kimiaudio_detok_chunks", "Detokenizer chunks made", value=m.detok_chunks)
        yield CounterMetricFamily(
            "kimiaudio_detok_guard_actions",
            "Chunks whose ODE steps the real-time guard lowered",
            value=m.detok_guard_actions,
        )
        yield CounterMetricFamily(
            "kimiaudio_detok_graph_captures",
            "Detokenizer CUDA graphs captured while serving (shapes not captured at start-up)",
            value=m.detok_graph_captures,
        )
        yield from self._engine(stats)

    @staticmethod
    def _engine(stats: dict):
        kv = GaugeMetricFamily("kimiaudio_kv_blocks", "Paged-KV pool blocks", labels=["state"])
        kv.add_metric(["free"], stats["kv_blocks_free"])
        kv.add_metric(["used"], stats["kv_blocks_total"] - stats["kv_blocks_free"])
        yield kv
        seqs = GaugeMetricFamily("kimiaudio_engine_sequences", "Engine sequences", labels=["queue"])
        seqs.add_metric(["running"], stats["running"])
        seqs.add_metric(["waiting"], stats["waiting"])
        yield seqs
        yield GaugeMetricFamily(
            "kimiaudio_pipeline_turns_in_flight", "Turns on the pipeline's workers", value=stats["turns"]
        )
        prefill = CounterMetricFamily(
            "kimiaudio_prefill_tokens", "Prompt positions prefilled, by prefix-cache outcome", labels=["cache"]
        )
        prefill.add_metric(["hit"], stats["prefill_tokens_cached"])
        prefill.add_metric(["miss"], stats["prefill_tokens_computed"])
        yield prefill
        for name, key, doc in (
            ("kimiaudio_decode_tokens", "decode_tokens", "Positions decoded"),
            ("kimiaudio_preemptions", "preemptions", "Sequences preempted (KV pool exhausted)"),
            ("kimiaudio_lm_steps", "steps", "LM engine steps"),
        ):
            yield CounterMetricFamily(name, doc, value=stats[key])
        largest = GaugeMetricFamily("kimiaudio_max_batch_size", "Largest batch seen per stage", labels=["stage"])
        for stage, size in stats["max_batch_sizes"].items():
            largest.add_metric([stage], size)
        yield largest
