"""One step of .ci/gpu-check, recorded as it ends: appends its record (command, status, seconds,
its JSON report or its output's last lines) to steps.jsonl and prints its headline figures for
summary.txt. Standard library only: it runs on the GPU machine's python beside the steps.

    python3 .ci/gpu_report.py NAME RC SECONDS LIMIT COMMAND STDOUT STDERR RECORDS
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GIB = 1 << 30


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _rows(report: dict) -> str:
    rows = report.get("rows") or []
    parts = []
    for r in rows:
        if "voice" in r:  # bench --voice: the same sessions without and with a voice prompt
            plain, voiced = r["no_voice"]["first_audio_ms_p50"], r["voice"]["first_audio_ms_p50"]
            parts.append(f"N={r['sessions']} 1st-audio p50 {plain:.0f}ms, with a voice {voiced:.0f}ms")
        elif "first_audio_ms_p50" in r:
            first, p95, rate = r["first_audio_ms_p50"], r["first_audio_ms_p95"], r["tokens_per_s"]
            blocked = (r.get("slow_lm_steps") or {}).get("slow_blocked_share")
            slow = "" if blocked is None else f", slow LM steps {100 * blocked:.0f}% blocked"
            gc, captures = r.get("gc_pauses"), r.get("detok_graph_captures")
            if gc:
                slow += f", gc {gc['count']} ({gc['full']} full) longest {gc['max_ms']:.0f}ms"
            if captures:
                slow += f", {captures} detok captures"
            trace = r.get("trace")  # bench --trace: the row's first seconds under the profiler
            if trace:
                slow += f", the GPU busy {100 * trace['busy_share']:.0f}% of its first {trace['seconds']:.1f}s"
            parts.append(f"N={r['sessions']} 1st-audio p50 {first:.0f}ms p95 {p95:.0f}ms {rate:.0f} tok/s{slow}")
        elif "step_ms_p50" in r and r.get("graphs", True):
            kind = r["weights"] if r.get("overlap", True) else f"{r['weights']} no-overlap"
            parts.append(f"{kind} B={r['batch']} {r['step_ms_p50']:.2f}ms ({r['ratio_to_floor']:.2f}x floor)")
    return "; ".join(parts)


def _memory(report: dict) -> str:
    check, plan = report.get("memory_check"), report.get("memory_plan") or {}
    if not check:
        return ""
    worst = check.get("worst_case_peak_reserved_bytes")
    expandable = {True: "expandable", False: "FIXED segments"}.get(report.get("expandable_segments"), "")
    return (
        f"; peak reserved {check['peak_reserved_bytes'] / GIB:.2f} GiB of {check['device_total_bytes'] / GIB:.2f} "
        f"({'within' if check['peak_within_device'] else 'OVER'}; plan for this run "
        f"{check['predicted_peak_reserved_bytes'] / GIB:.2f}, {100 * check['peak_vs_predicted']:+.1f}%"
        + (f"; worst case {worst / GIB:.2f}" if worst else "")
        + f"); KV {plan.get('kv_pool_tokens', 0):,} tokens, {plan.get('tokens_per_session', 0):,} a session"
        + (f"; {expandable}" if expandable else "")
    )


def headline(name: str, report, out: str, err: str) -> str:
    if name == "smoke" and isinstance(report, dict):
        rt, chat = report.get("realtime", {}), report.get("chat", {})
        return (
            f"ok={report.get('ok')} device={report.get('device')} ready {report.get('ready_s')}s; "
            f"realtime ok={rt.get('ok')} first audio {rt.get('first_audio_ms_after_speech_sent')}ms "
            f"{rt.get('audio_seconds')}s {rt.get('error', '')}; chat ok={chat.get('ok')} {chat.get('seconds')}s "
            f"{chat.get('error') or ''}"
        ).strip()
    if name == "estimates" and isinstance(report, dict):
        proposed = report.get("proposed", {})
        return "proposed " + ", ".join(f"{k} {v['measured']}" for k, v in proposed.items())
    if isinstance(report, dict) and report.get("rows"):
        return _rows(report) + _memory(report)
    lines = [line for line in (out.splitlines() + err.splitlines()) if line.strip()]
    if name == "tests":
        tail = [line for line in out.splitlines() if " passed" in line or " failed" in line or "error" in line]
        skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
        return (tail[-1] if tail else (lines[-1] if lines else "")) + (f"; {len(skips)} skip lines" if skips else "")
    return lines[-1][:300] if lines else ""


def main() -> int:
    name, rc, took, limit, command, out_path, err_path, records = sys.argv[1:9]
    out = Path(out_path).read_text(errors="replace")
    err = Path(err_path).read_text(errors="replace")
    report = _json(out)
    record = {
        "step": name,
        "rc": int(rc),
        "seconds": int(took),
        "limit": int(limit),
        "command": command,
        "report": report,
        "output_tail": None if report is not None else out.splitlines()[-60:],
        "stderr_tail": err.splitlines()[-40:],
    }
    with open(records, "a") as f:
        f.write(json.dumps(record) + "\n")
    try:
        print(headline(name, report, out, err))
    except (KeyError, TypeError, ValueError) as exc:  # a report of another shape: still recorded
        print(f"(no headline: {type(exc).__name__}: {exc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
