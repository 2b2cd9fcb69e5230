"""The pipeline bench's printed tables: a line per row of its figures, and a line per row of
why first audio waited (each stage's p50 / p95) and why LM steps were slow."""

from __future__ import annotations

from kimiaudio.bench.pipeline_bench import BenchRow
from kimiaudio.bench.session_run import STAGES
from kimiaudio.bench.slow_steps import format_slow_steps


def _labels(rows: list[BenchRow]) -> tuple[str, list[str]]:
    """The first column: the session count, and its arrivals where the rows differ in them."""
    if len({r.arrivals for r in rows}) < 2:
        return f"{'N':>4}", [f"{r.sessions:>4}" for r in rows]
    names = [f"{r.sessions} {r.arrivals}" for r in rows]
    width = max(len(name) for name in names)
    return f"{'N arrivals':>{width}}", [f"{name:>{width}}" for name in names]


def format_rows(rows: list[BenchRow]) -> str:
    label, labels = _labels(rows)
    head = (
        f"{label} {'tok/s':>8} {'tok/s/ses':>9} {'LM step p50':>11} {'p95':>8} {'detok p50':>9} {'1st audio p50':>13} "
        f"{'p95':>8} {'RTF p50':>8} {'stall p95':>9} {'underruns':>9} {'guard':>6} {'KV used':>9} {'hit rate':>8} "
        f"{'ref tok/s':>9} {'speedup':>8} "
        f"{'LM tok/s':>9} {'LM ref':>8} {'LM speedup':>10}"
    )
    lines = [head]
    for r, name in zip(rows, labels):
        ref = (
            (
                f"{r.reference_tokens_per_s:9.1f} {r.speedup_vs_reference:7.1f}x {r.lm_tokens_per_s:9.1f} "
                f"{r.lm_reference_tokens_per_s:8.1f} {r.lm_speedup:9.1f}x"
            )
            if r.reference_tokens_per_s
            else ""
        )
        lines.append(
            f"{name} {r.tokens_per_s:8.1f} {r.tokens_per_s_per_session:9.1f} {r.lm_step_ms_p50:9.1f}ms "
            f"{r.lm_step_ms_p95:6.1f}ms {r.detok_ms_p50:7.1f}ms {r.first_audio_ms_p50:11.0f}ms "
            f"{r.first_audio_ms_p95:6.0f}ms {r.rtf_p50:8.2f} "
            f"{r.stall_ms_p95:7.0f}ms {r.underruns:>9} {r.guard_actions:>6} "
            f"{r.kv_blocks_used_peak:>4}/{r.kv_blocks_total:<4} {r.prefix_cache_hit_rate:8.2f} {ref}"
        )
    return "\n".join(lines)


def format_stages(rows: list[BenchRow]) -> str:
    """Per row: each stage of a turn's wait for its first audio (p50 / p95, ms), and why LM steps were slow."""
    label, labels = _labels(rows)
    lines = [f"{label} stages p50 / p95 ms: " + ", ".join(STAGES)]
    for r, name in zip(rows, labels):
        stages = ", ".join(f"{r.stages_ms_p50[s]:.0f}/{r.stages_ms_p95[s]:.0f}" for s in STAGES)
        gc = r.gc_pauses
        lines.append(
            f"{name} {stages}; {format_slow_steps(r.slow_lm_steps)}; garbage collections "
            f"{gc['count']} ({gc['full']} full), {gc['total_ms']:.0f} ms, the longest {gc['max_ms']:.1f} ms; "
            f"detokenizer graphs captured while serving {r.detok_graph_captures}"
        )
    return "\n".join(lines)
