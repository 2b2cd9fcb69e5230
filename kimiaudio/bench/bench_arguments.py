"""The `bench` command line, its defaults filled in and what it alone can be wrong about refused
before any model loads (minutes for the 7B): counts out of range, input files that are not
there, options that do not go together."""

from __future__ import annotations

from pathlib import Path

from kimiaudio.bench.arrivals import Arrivals
from kimiaudio.errors import KimiAudioError


def check_arguments(args) -> list[Arrivals]:
    """Fill in the defaults (a soak is a smaller, longer run than a throughput bench: its own)
    and check the options -> the arrivals asked for (a row each per session count);
    KimiAudioError naming the option."""
    if args.sessions is None:
        args.sessions = "4" if args.soak else "1,4,16,64"
    args.turns = args.turns if args.turns is not None else (3 if args.soak else 1)
    if args.turns < 1 or args.max_new_tokens < 1:
        raise KimiAudioError(f"--turns {args.turns} and --max-new-tokens {args.max_new_tokens} must be positive")
    if getattr(args, "client_processes", None) is not None and args.client_processes < 0:
        raise KimiAudioError(f"--client-processes {args.client_processes}: expected 0 or more")
    files = [("--speech", path) for path in args.speech]
    if getattr(args, "voice", None):
        files.append(("--voice", args.voice))
    for flag, path in files:
        if not Path(path).is_file():
            raise KimiAudioError(f"{flag} {path}: no such file")
    arrivals = Arrivals.parse_all(getattr(args, "arrivals", None) or "burst")
    others = ("soak", "webrtc", "http", "transcribe", "memory_plan")
    elsewhere = args.random_weights == "7b" or getattr(args, "voice", None) is not None
    if any(a.rate is not None for a in arrivals) and (elsewhere or any(getattr(args, k, False) for k in others)):
        raise KimiAudioError(
            "--arrivals poisson:RATE goes with the pipeline bench (not --random-weights 7b, --soak, --webrtc, "
            "--http, --transcribe, --voice or --memory-plan)"
        )
    modes = [f"--{k.replace('_', '-')}" for k in (*others, "voice") if getattr(args, k, None) not in (None, False)]
    if len(modes) > 1:
        raise KimiAudioError(f"{' and '.join(modes)}: one bench at a time")
    if args.url and not args.soak:
        raise KimiAudioError("--url goes with --soak (the other benches run their own server)")
    if getattr(args, "profile", False) and args.random_weights != "7b":
        raise KimiAudioError("--profile goes with --random-weights 7b (the decode steps it profiles)")
    if getattr(args, "positions", None) is not None and not getattr(args, "memory_plan", False):
        raise KimiAudioError("--positions goes with --memory-plan (the positions a plan must hold)")
    if getattr(args, "trace", None) is not None:
        if elsewhere or any(getattr(args, k, False) for k in others):
            raise KimiAudioError(
                "--trace goes with the pipeline bench (not --random-weights 7b, --soak, --webrtc, --http, "
                "--transcribe, --voice or --memory-plan)"
            )
        _writable_directory("--trace", Path(args.trace))
    return arrivals


def _writable_directory(flag: str, path: Path) -> None:
    """Create `path` if needed; KimiAudioError naming the flag unless files can be written there."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".kimiaudio-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise KimiAudioError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None


def session_counts(args) -> list[int]:
    """--sessions of a bench other than the soak (which takes one count): the rows to measure."""
    try:
        sessions = [int(x) for x in args.sessions.split(",")]  # (an empty entry is refused too)
    except ValueError:
        raise KimiAudioError(f"--sessions {args.sessions!r}: expected comma-separated integers, e.g. 1,4,16") from None
    if not sessions or min(sessions) < 1:
        raise KimiAudioError(f"--sessions {args.sessions!r}: each count must be positive")
    return sessions
