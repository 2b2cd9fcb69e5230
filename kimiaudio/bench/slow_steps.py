"""Why LM steps were slow: the steps of a bench row above SLOW_RATIO x their p50, counted by
what they carried (pipeline/step_record.py: a prefill chunk, encoder stages before them or an
encoder batch running beside them, a detokenizer batch or a detokenizer graph capture beside
them, a garbage collection in them, a shape met for the first time), and the slowest few in
full; and how the slow steps' time divides: the share the host spent blocked on the device's
samples (near 1: slow on the device, work beside them on the GPU), the share the LM worker's
thread ran on a CPU (host work), and the share it was blocked otherwise (waiting for the
interpreter's lock while other threads ran Python); and, across those, the share garbage
collections took (they hold the lock: every thread stops for them). The same keys on every
device (on the CPU nothing runs beside a step on the device, so `encode` there means stages
run just before it)."""

from __future__ import annotations

from collections.abc import Sequence

from kimiaudio.bench.stats import percentile
from kimiaudio.pipeline.step_record import STEP_TAGS, LmStepRecord

SLOW_RATIO = 1.3  # issue 29's goal: the LM step's p95 within 1.3x its p50
NUM_SLOWEST = 5


def slow_step_report(records: Sequence[LmStepRecord]) -> dict:
    """{threshold_ms, steps, slow, by_tag: tag -> slow steps carrying it ("none": nothing), slowest}."""
    if not records:
        return {
            "threshold_ms": None,
            "steps": 0,
            "slow": 0,
            "by_tag": dict.fromkeys((*STEP_TAGS, "none"), 0),
            "slow_device_wait_share": None,
            "slow_cpu_share": None,
            "slow_blocked_share": None,
            "slow_gc_share": None,
            "slowest": [],
        }
    threshold = SLOW_RATIO * percentile([r.seconds for r in records], 50, empty=0.0)
    slow = [r for r in records if r.seconds > threshold]
    by_tag = dict.fromkeys((*STEP_TAGS, "none"), 0)
    for record in slow:
        for tag in record.tags or ["none"]:
            by_tag[tag] += 1
    slowest = sorted(slow, key=lambda r: -r.seconds)[:NUM_SLOWEST]
    slow_s = sum(r.seconds for r in slow)
    return {
        "threshold_ms": round(1000 * threshold, 3),
        "steps": len(records),
        "slow": len(slow),
        "by_tag": by_tag,
        "slow_device_wait_share": _share([r.device_wait_s for r in slow], slow_s),
        "slow_cpu_share": _share([r.cpu_s for r in slow], slow_s),
        "slow_blocked_share": _share([r.blocked_s for r in slow], slow_s),
        "slow_gc_share": _share([min(r.gc_s, r.seconds) for r in slow], slow_s),
        "slowest": [
            {
                "ms": round(1000 * r.seconds, 3),
                "device_wait_ms": round(1000 * r.device_wait_s, 3),
                "cpu_ms": round(1000 * r.cpu_s, 3),
                "blocked_ms": round(1000 * r.blocked_s, 3),
                "gc_ms": round(1000 * r.gc_s, 3),
                "decoding": r.num_decoding,
                "prefill_tokens": r.prefill_tokens,
                "encode_stages": r.encode_stages,
                "encode_on_device": r.encode_on_device,
                "detok_overlap": r.detok_overlap,
                "graph_capture": r.graph_capture,
                "new_shape": r.new_shape,
                "tags": r.tags,
            }
            for r in slowest
        ],
    }


def _share(parts: list[float], total: float) -> float | None:
    return round(min(sum(parts) / total, 1.0), 3) if total > 0 else None


def format_slow_steps(report: dict) -> str:
    """One line: how many steps were slow and what they carried."""
    if not report["steps"]:
        return "no LM steps"
    tags = ", ".join(f"{tag} {count}" for tag, count in report["by_tag"].items() if count)
    share = report["slow_device_wait_share"]
    waited = ""
    if share is not None:
        waited = (
            f"; of their time {100 * share:.0f}% waiting on the device, {100 * report['slow_cpu_share']:.0f}% "
            f"running on the host, {100 * report['slow_blocked_share']:.0f}% blocked (the interpreter's lock)"
        )
        if report["slow_gc_share"]:
            waited += f"; {100 * report['slow_gc_share']:.0f}% in garbage collection"
    return (
        f"{report['slow']}/{report['steps']} LM steps > {report['threshold_ms']:.1f} ms "
        f"({SLOW_RATIO:g}x p50){': ' + tags if tags else ''}{waited}"
    )
