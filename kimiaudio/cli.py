"""Command line: `python -m kimiaudio {serve,chat,transcribe,bench,demo-checkpoint}`.

Every user mistake (bad flag, missing file, bad config key) ends in one line on stderr and
exit status 2; an interrupted command exits 130. `--debug` shows tracebacks of internal errors.
"""

from __future__ import annotations

import argparse
import sys

from kimiaudio.config import Config, load_config
from kimiaudio.errors import KimiAudioError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + exits 2; keep it to one line
        self.exit(2, f"{self.prog}: error: {message}\n")


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="config TOML file (default: built-in defaults)")
    p.add_argument("--model", help="Kimi-Audio-7B-Instruct directory (default: the demo checkpoint)")
    p.add_argument("--glm-tokenizer", help="glm-4-voice-tokenizer directory (default: MODEL/glm-4-voice-tokenizer)")
    p.add_argument("--device", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", help="auto | float32 | bfloat16 | float16")
    p.add_argument(
        "--weights",
        help="auto | bf16 | fp8 | int8: the LM's and the DiT's linear weights ([model] weights and [detok] weights)",
    )
    p.add_argument("--data-dir", help="where the demo checkpoint and the history database live")
    p.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="least severe log lines shown (default INFO; serve: one line per session, per answer and per /v1 request)",
    )


def _add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--greedy", action="store_true", help="greedy decoding of both streams")
    p.add_argument("--seed", type=int, help="seed of the sampler")
    p.add_argument("--max-new-tokens", type=int, help="generation limit (default: the official one)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kimiaudio", description="Kimi-Audio speech-to-speech server and tools")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("serve", help="start the real-time server and demo page")
    _add_model_options(p)
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8080)")
    p.add_argument("--tls-cert", help="PEM certificate file: serve HTTPS and WSS (with --tls-key)")
    p.add_argument("--tls-key", help="PEM private key file of --tls-cert")

    p = sub.add_parser("chat", help="answer one or more spoken user turns, write the spoken reply")
    _add_model_options(p)
    _add_sampling_options(p)
    p.add_argument("inputs", nargs="+", metavar="IN", help="audio file of a user turn (wav, flac, ogg, mp3)")
    p.add_argument(
        "--text", action="append", default=[], help="a user text message before the first audio turn (repeatable)"
    )
    p.add_argument(
        "--out",
        default="reply.wav",
        help="file for the last reply (24 kHz; .wav, .mp3, .flac, .ogg/.opus or .aac by its suffix); earlier "
        "replies go to OUT.turnN.SUFFIX",
    )
    p.add_argument("--json", action="store_true", help="print text, token ids and timings as JSON")

    p = sub.add_parser("transcribe", help="speech to text (no detokenizer loaded)")
    _add_model_options(p)
    _add_sampling_options(p)
    p.add_argument("input", metavar="IN", help="audio file")
    p.add_argument("--json", action="store_true", help="print text, token ids and timings as JSON")

    p = sub.add_parser("bench", help="throughput and latency of the serving pipeline")
    _add_model_options(p)
    p.add_argument("--sessions", help="comma-separated concurrent session counts (default 1,4,16,64; --soak: 4)")
    p.add_argument("--turns", type=int, help="turns per session (default 1; --soak: 3)")
    p.add_argument("--speech", action="append", default=[], help="speech file(s) to use instead of synthetic input")
    p.add_argument("--max-new-tokens", type=int, default=64, help="generated positions per turn")
    p.add_argument(
        "--random-weights",
        choices=["7b", "full"],
        help="random weights in the real shapes: 7b = the LM's decode steps (GPU); full = every "
        "component through the pipeline (GPU; a shrunken shape on the CPU), no reference",
    )
    p.add_argument(
        "--memory-plan",
        action="store_true",
        help="print the device memory plan of --random-weights full (or the configured checkpoint) "
        "for max(--sessions) sessions, computed on the meta device: nothing is loaded",
    )
    p.add_argument(
        "--memory-estimates",
        action="store_true",
        help="measure on this GPU what the memory plan estimates (graph pools, activations, CUDA "
        "context; random full-size weights) and print the values for pipeline/memory_estimates.py",
    )
    p.add_argument(
        "--card-gib",
        type=float,
        help="--memory-plan: the card's memory in GiB (default: this GPU's); on a GPU bench run: cap "
        "this process at that many GiB, as on a card of that size",
    )
    p.add_argument(
        "--positions",
        type=int,
        help="--memory-plan: positions each session must hold for the plan to fit (default 4096)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="with --random-weights 7b: torch.profiler over decode steps per batch size (GPU-busy vs wall "
        "time a step, kernels a step, the top kernels)",
    )
    p.add_argument(
        "--trace",
        metavar="DIR",
        help="the pipeline bench: each row's first seconds under torch.profiler, written to "
        "DIR/trace-<sessions>.json.gz (a Chrome trace), with per-stream GPU busy time in the row's JSON",
    )
    p.add_argument(
        "--arrivals",
        default="burst",
        help="when sessions speak their first turn: burst (all at once, the default) or poisson:RATE "
        "(a Poisson process of RATE sessions a second, fixed seed); poisson:RATE,RATE,... runs a row for each",
    )
    p.add_argument("--no-reference", action="store_true", help="skip the offline reference-loop baseline")
    p.add_argument(
        "--natural-lengths",
        action="store_true",
        help="let each reply end at its own stop tokens (default: every turn runs to --max-new-tokens, "
        "as vLLM's --ignore-eos, so every step runs all sessions)",
    )
    p.add_argument(
        "--webrtc",
        action="store_true",
        help="through the real server on loopback: --sessions WebRTC clients speaking --turns turns each",
    )
    p.add_argument(
        "--http",
        action="store_true",
        help="through the real server on loopback: --sessions concurrent streaming chat requests "
        "(time to first audio byte)",
    )
    p.add_argument(
        "--soak",
        action="store_true",
        help="the real server on loopback under --sessions sessions speaking --turns turns with faults "
        "(barge-ins, hang-ups and reconnects, malformed events); checks the books at the end",
    )
    p.add_argument("--seconds", type=float, default=600.0, help="--soak: stop starting turns after this long")
    p.add_argument("--fault-rate", type=float, default=0.3, help="--soak: share of turns with a fault")
    p.add_argument(
        "--url",
        help="--soak: drive the server (or a fleet's front, e.g. HAProxy) running at this URL "
        "instead of one started here (KIMIAUDIO_API_KEY: its key)",
    )
    p.add_argument(
        "--client-processes",
        type=int,
        help="--soak: worker processes for the clients (default: 0 up to 4 sessions, else one per 8)",
    )
    p.add_argument(
        "--transcribe",
        action="store_true",
        help="answers' first audio (engine steps, ms) without and with each user turn transcribed beside them",
    )
    p.add_argument(
        "--voice",
        nargs="?",
        const="",
        metavar="FILE",
        help="first-audio latency without and with a voice made from FILE (a synthetic voice if none)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")

    p = sub.add_parser("demo-checkpoint", help="write the tiny random-weight demo checkpoint")
    p.add_argument("dir", help="output directory")
    p.add_argument("--seed", type=int, default=0)
    return parser


PATH_FLAGS = ("config", "model", "glm_tokenizer", "data_dir", "tls_cert", "tls_key")


def config_from_args(args: argparse.Namespace) -> Config:
    for flag in PATH_FLAGS:  # an unset shell variable, say: never the current directory by accident
        value = getattr(args, flag, None)
        if value is not None and not value.strip():
            raise KimiAudioError(f"--{flag.replace('_', '-')}: an empty path; leave the flag out for its default")
    overrides: dict[str, dict] = {"model": {}, "storage": {}, "server": {}}
    for flag, key in (
        ("model", "path"),
        ("glm_tokenizer", "glm_tokenizer_path"),
        ("device", "device"),
        ("dtype", "dtype"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            overrides["model"][key] = value
    if getattr(args, "weights", None) is not None:
        overrides["model"]["weights"] = args.weights
        overrides["detok"] = {"weights": args.weights}
    if getattr(args, "data_dir", None) is not None:
        overrides["storage"]["data_dir"] = args.data_dir
    for flag in ("host", "port", "tls_cert", "tls_key"):
        if getattr(args, flag, None) is not None:
            overrides["server"][flag] = getattr(args, flag)
    config = load_config(getattr(args, "config", None), {})
    # Paths given on the command line are relative to the current directory, not the config file.
    for section, key in (
        ("model", "path"),
        ("model", "glm_tokenizer_path"),
        ("storage", "data_dir"),
        ("server", "tls_cert"),
        ("server", "tls_key"),
    ):
        if key in overrides[section]:
            from pathlib import Path

            overrides[section][key] = str(Path(overrides[section][key]).expanduser().resolve())
    from kimiaudio.config import apply_overrides

    return apply_overrides(config, overrides)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        # Inside the try: the commands' imports load torch (seconds), and a Ctrl-C then is an interrupt too.
        from kimiaudio.layers.cuda_allocator_settings import prefer_expandable_segments
        from kimiaudio.server.observe.log_setup import configure_logging

        prefer_expandable_segments()  # before anything allocates on a GPU
        configure_logging(getattr(args, "log_level", "INFO"))
        if args.command == "demo-checkpoint":
            from kimiaudio.random_weights.demo_checkpoint import write_demo_checkpoint

            path = write_demo_checkpoint(args.dir, seed=args.seed, progress=True)
            print(f"wrote demo checkpoint (random weights) to {path}")
            return 0
        config = config_from_args(args)
        if args.command == "serve":
            from kimiaudio.server.serve import run_server

            return run_server(config) or 0
        if args.command == "bench":
            from kimiaudio.bench.command import run_bench_command

            return run_bench_command(config, args)
        from kimiaudio.pipeline.offline_commands import run_chat_command, run_transcribe_command

        if args.command == "chat":
            return run_chat_command(config, args)
        return run_transcribe_command(config, args)
    except KimiAudioError as exc:
        print(f"kimiaudio: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kimiaudio: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # an internal bug: one line unless --debug
        if getattr(args, "debug", False):
            raise
        print(f"kimiaudio: internal error: {type(exc).__name__}: {exc} (run with --debug for details)", file=sys.stderr)
        return 1
