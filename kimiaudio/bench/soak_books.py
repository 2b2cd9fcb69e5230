"""The soak's books: what its clients saw, checked against its plan, and the report printed.

Shared by the in-process soak (soak.py, which adds the server's own books: KV blocks, slots,
integrity, RSS, its log) and the soak of a running server or fleet front (soak_remote.py).
"""

from __future__ import annotations

from kimiaudio.bench.soak_clients import FAULTS, SessionLog
from kimiaudio.bench.stats import ms_p50_p95

FAULT_KINDS = FAULTS[1:]  # barge_in, disconnect, malformed ("none" is no fault)
SETTLE_S = 20.0  # after the clients: sessions closing, turns ending, the pool refilling


async def missing_commits(store, logs: list[SessionLog]) -> list[str]:
    """ "conversation#index" of each user turn a client saw committed that `store` (anything with
    `get_conversation`: the store, or the API read over HTTP) lacks, or holds without audio."""
    missing = []
    for log in logs:
        for conversation_id, index in log.commits:
            if conversation_id is None or index is None:
                continue  # a transport whose commits name no stored turn
            conversation = await store.get_conversation(conversation_id)
            turns = {t["index"]: t for t in (conversation or {}).get("turns", [])}
            turn = turns.get(index)
            if turn is None or turn["role"] != "user" or not turn["has_audio"]:
                missing.append(f"{conversation_id}#{index}")
    return missing


def _planned(plan: list[list[str]]) -> tuple[list[int], dict[str, int]]:
    """Per session, the user turns its plan commits (a barge-in turn commits two: the turn and
    the utterance spoken over its answer); and how many faults of each kind the plan injects."""
    utterances = [sum(2 if fault == "barge_in" else 1 for fault in turns) for turns in plan]
    faults = {kind: sum(turns.count(kind) for turns in plan) for kind in FAULT_KINDS}
    return utterances, {kind: n for kind, n in faults.items() if n}


def client_books(plan: list[list[str]], logs: list[SessionLog], kinds: list[str]) -> tuple[dict, dict, dict]:
    """What the clients saw, checked against the plan: (checks {name: (value, limit)}, figures
    for the report, details of what went wrong)."""
    planned_utterances, planned_faults = _planned(plan)
    # Per session: a session that committed more (the VAD split an utterance) makes up for no other's loss.
    short_turns = sum(max(0, want - len(log.commits)) for want, log in zip(planned_utterances, logs))
    happened = {kind: sum(log.faults[kind] for log in logs) for kind in FAULT_KINDS}
    missing_faults = {kind: n - happened[kind] for kind, n in planned_faults.items() if happened[kind] < n}
    unfinished = [
        rid for log in logs for rid, status in log.responses.items() if status is None and rid not in log.abandoned
    ]
    checks = {
        "responses without a final status (client side)": (len(unfinished), 0),
        "client-side problems": (sum(len(log.problems) for log in logs), 0),
        # A run that ended before its plan did (e.g. --seconds shorter than connecting) tested nothing.
        "planned user turns not committed": (short_turns, 0),
        "planned faults that never happened": (sum(missing_faults.values()), 0),
    }
    first = [x for log in logs for x in log.first_audio_s]
    statuses = [s for log in logs for s in log.responses.values()]
    figures = {
        "commits": sum(len(log.commits) for log in logs),
        "responses": len(statuses),
        "commits_by_transport": {
            kind: sum(len(log.commits) for log in logs if log.transport == kind) for kind in kinds
        },
        "responses_by_status": {s: statuses.count(s) for s in ("completed", "incomplete", "cancelled", "failed")},
        "abandoned_by_hang_up": sum(len(log.abandoned) for log in logs),
        # Reconnects that found their conversation still held by the session they hung up.
        "busy_waits": sum(log.busy_waits for log in logs),
        "planned_commits": sum(planned_utterances),
        "planned_faults": planned_faults,
        "faults": happened,
        **dict(
            zip(
                ("commit_to_first_audio_ms_p50", "commit_to_first_audio_ms_p95"),
                (None if ms is None else round(ms, 1) for ms in ms_p50_p95(first)),
            )
        ),
    }
    details = {
        "faults short of the plan": [
            f"{kind}: {happened[kind]} of {n}" for kind, n in planned_faults.items() if kind in missing_faults
        ],
        "unfinished": unfinished[:10],
        "problems": [p for log in logs for p in log.problems][:10],
    }
    return checks, figures, details


def checked(checks: dict[str, tuple]) -> dict:
    """The report's "checks" and "ok" from {name: (value, limit)}."""
    return {
        "checks": {
            name: {"value": value, "limit": limit, "ok": value <= limit} for name, (value, limit) in checks.items()
        },
        "ok": all(value <= limit for value, limit in checks.values()),
    }


def print_report(report: dict) -> None:
    target = f" against {report['url']}" if "url" in report else ""
    print(
        f"soak{target}: {report['sessions']} sessions ({'+'.join(report['transports'])}) "
        f"x {report['turns_per_session']} turns in {report['wall_s']} s (seed {report['seed']}, "
        f"clients in {report['client_processes']} worker "
        f"processes); {report['commits']} user turns committed, "
        f"{report['responses']} responses {report['responses_by_status']}, {report['abandoned_by_hang_up']} cut by "
        f"hang-ups, {report['busy_waits']} reconnects waited for their conversation; faults {report['faults']}"
        + (f"; preemptions {report['preemptions']}" if target == "" else "")
    )
    latency = (
        f"commit -> first audio p50 {report['commit_to_first_audio_ms_p50']} ms, "
        f"p95 {report['commit_to_first_audio_ms_p95']} ms"
    )
    if target:  # a running server's memory is its own
        print(latency)
    else:
        print(
            f"{latency}; RSS {report['rss_mb_start']} MB at the start, {report['rss_mb_by_quarter']} MB at each "
            f"quarter of the run, {report['rss_mb_end']} MB at the end"
        )
    for name, check in report["checks"].items():
        print(f"  {'ok  ' if check['ok'] else 'FAIL'} {name}: {check['value']} (limit {check['limit']})")
    for name, items in report["details"].items():
        if items:
            print(f"  {name}: {items}")
    print(verdict(report))


def verdict(report: dict) -> str:
    """ "soak passed", or "soak FAILED: " and the checks that failed."""
    failed = [name for name, check in report["checks"].items() if not check["ok"]]
    return "soak passed" if report["ok"] else f"soak FAILED: {'; '.join(failed)}"
