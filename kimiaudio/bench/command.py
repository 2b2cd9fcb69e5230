"""`python -m kimiaudio bench`: parse the options, load the stack, run the chosen bench, print."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE
from kimiaudio.bench.bench_arguments import check_arguments, session_counts
from kimiaudio.bench.pipeline_bench import run_bench
from kimiaudio.bench.row_tables import format_rows, format_stages
from kimiaudio.errors import KimiAudioError

PLAN_POSITIONS = 4096  # --memory-plan: what each session must hold, unless --positions says


def run_bench_command(config, args) -> int:
    from kimiaudio.audio.io import load_audio
    from kimiaudio.layers.device_memory import peak_memory
    from kimiaudio.pipeline.model_stack import DEMO_NOTICE, ModelStack, freeze_loaded_objects

    arrivals = check_arguments(args)
    if args.soak:
        from kimiaudio.bench.soak import run_soak_command

        return run_soak_command(config, args)
    sessions = session_counts(args)
    # The pipelines serve max(--sessions): the memory plan, the detokenizer's batch buckets and
    # its state are those of a server with that many sessions (as `--memory-plan` plans them).
    config.server.max_sessions = max(sessions)
    if getattr(args, "memory_plan", False):
        return _memory_plan_command(config, args)
    if args.card_gib is not None:
        _cap_gpu(config, args.card_gib)
    if getattr(args, "memory_estimates", False):
        from kimiaudio.bench.estimate_memory import run_memory_estimates

        return run_memory_estimates(config, args)
    if args.random_weights == "7b":
        from kimiaudio.bench.decode_7b import run_random_7b

        return run_random_7b(config, sessions, args)
    if args.random_weights == "full":
        stack = _random_full_stack(config)
    else:
        stack = ModelStack.load(config, progress=not args.json)
    if stack.detokenizer is None:
        raise KimiAudioError("bench needs the detokenizer: set model.text_only = false")
    from kimiaudio.pipeline.memory_plan import plan_stack

    memory = plan_stack(stack, config)  # what each pipeline below plans, from the same inputs
    freeze_loaded_objects()
    speech = [load_audio(path) for path in args.speech] or None
    if getattr(args, "voice", None) is not None:
        from kimiaudio.bench.voice_bench import print_voice_rows, run_voice_bench, voice_audio

        if stack.is_demo and not args.json:
            print(DEMO_NOTICE)
        voice_rows = run_voice_bench(
            stack,
            config,
            sessions,
            args.turns,
            args.max_new_tokens,
            speech,
            args.voice or None,
            fixed_length=not args.natural_lengths,
        )
        print_voice_rows(voice_rows, voice_audio(args.voice or None)[1].size / SPEECH_OUTPUT_RATE, args.json)
        return 0
    if getattr(args, "transcribe", False):
        from kimiaudio.bench.transcription_bench import print_transcription_rows, run_transcription_bench

        if stack.is_demo and not args.json:
            print(DEMO_NOTICE)
        print_transcription_rows(
            run_transcription_bench(
                stack, config, sessions, args.turns, args.max_new_tokens, speech, fixed_length=not args.natural_lengths
            ),
            args.json,
        )
        return 0
    if args.http:
        from kimiaudio.bench.http_bench import print_rows, run_http_bench

        if stack.is_demo and not args.json:
            print(DEMO_NOTICE)
        print_rows(run_http_bench(stack, config, sessions, args.turns, speech, args.max_new_tokens), args.json)
        return 0
    if args.webrtc:
        from kimiaudio.bench.webrtc_bench import print_rows, run_webrtc_bench

        if stack.is_demo and not args.json:
            print(DEMO_NOTICE)
        print_rows(run_webrtc_bench(stack, config, sessions, args.turns, speech, args.max_new_tokens), args.json)
        return 0
    rows = run_bench(
        stack,
        config,
        sessions,
        args.turns,
        args.max_new_tokens,
        speech,
        reference=not (args.no_reference or args.random_weights),
        progress=not args.json,
        fixed_length=not args.natural_lengths,
        arrivals=arrivals,
        trace_dir=Path(args.trace) if args.trace else None,
    )
    info = {
        "device": str(stack.device),
        "dtype": str(stack.dtype).replace("torch.", ""),
        "demo_weights": stack.is_demo,
        "model": "random weights" if args.random_weights else str(stack.paths.root),
        "max_new_tokens": args.max_new_tokens,
        "turns": args.turns,
        "turn_lengths": "natural" if args.natural_lengths else "fixed",
        "arrivals": ", ".join(a.name for a in arrivals),
        "encode_batch_size": config.audio.encode_batch_size,
        "whisper_window": config.audio.whisper_window,
    }
    # The same keys on every device (null where there is no GPU): one schema for every report.
    info.update(
        card_gib=args.card_gib,
        peak_allocated_bytes=None,
        peak_reserved_bytes=None,
        expandable_segments=None,
        memory_plan=memory,
        memory_check=None,
    )
    if stack.device.type == "cuda":
        info.update(peak_memory(stack.device))
        info["memory_check"] = memory_check(memory, info["peak_reserved_bytes"], rows)
    if args.json:
        print(json.dumps({**info, "rows": [asdict(r) for r in rows]}, indent=1))
    else:
        from kimiaudio.pipeline.memory_report import format_memory_plan

        print(format_memory_plan(memory))
        if stack.is_demo:
            print(DEMO_NOTICE)
        if info["memory_check"] is not None:
            print("memory: " + ", ".join(f"{k} {v}" for k, v in info["memory_check"].items()))
        length = "at most" if args.natural_lengths else "exactly"
        print(
            f"device {info['device']} dtype {info['dtype']}, {length} {args.max_new_tokens} new positions per turn, "
            f"{args.turns} turn(s) per session, arrivals {info['arrivals']}; reference = the same sessions through "
            "the batch-1 loop, one by one"
        )
        print(format_rows(rows))
        print(format_stages(rows))
        print(
            "tok/s = generated positions (one text + one audio token each) per second. speedup: the whole "
            "pipeline vs encode + reference loop + offline detokenizer; LM speedup: engine vs reference loop "
            "alone, every turn running to its new-position limit (stop tokens ignored)."
        )
    return 0


def _cap_gpu(config, gib: float) -> None:
    """--card-gib on a bench run: this process may use `gib` GiB of the GPU, no more (the KV
    pool and `auto` size themselves from the cap), so a larger card serves as a smaller one."""
    from kimiaudio.checkpoint.paths import resolve_device
    from kimiaudio.layers.device_memory import cap_process

    device = resolve_device(config.model.device)
    if device.type != "cuda":
        raise KimiAudioError(f"--card-gib {gib:g} caps a GPU: run with --device cuda, or plan with --memory-plan")
    cap_process(device, gib)


def memory_check(plan: dict, peak_reserved: int, rows: list) -> dict:
    """The allocator's reserved peak against the plan. Every planned part but the CUDA context
    (outside the allocator), and the KV pool, is what the plan says the allocator may hold at
    most; under a cap (--card-gib) the allocator may hold no more than the cap. Two parts are
    reserved for their worst case and fill only as a run uses them: the detokenizer's state (each
    session's prefix K/V at its cap) and the voice cache. The prediction for this run takes those
    two at what its rows filled (their peaks), so it checks every other part against the device."""
    worst = plan["reserved_total"] - plan["reserved"].get("cuda_context", 0) + plan["kv_pool"]
    filled = {
        "detok_state": max((r.detok_state_peak_bytes for r in rows), default=0),
        "voice_cache": max((r.voice_cache_peak_bytes for r in rows), default=0),
    }
    unfilled = sum(max(plan["reserved"].get(part, 0) - used, 0) for part, used in filled.items())
    predicted = worst - unfilled
    return {
        "device_total_bytes": plan["device_total"],
        "worst_case_peak_reserved_bytes": worst,
        "detok_state_filled_bytes": filled["detok_state"],
        "voice_cache_filled_bytes": filled["voice_cache"],
        "predicted_peak_reserved_bytes": predicted,
        "peak_reserved_bytes": peak_reserved,
        "peak_within_device": peak_reserved <= plan["device_total"],
        "peak_vs_predicted": round(peak_reserved / predicted - 1, 4),
        "peak_vs_worst_case": round(peak_reserved / worst - 1, 4),
    }


def _random_full_stack(config):
    """Every component with random weights in the real shapes on a GPU (a shrunken shape of
    the same code on the CPU), its detokenizer graphs captured (the pipelines reuse them)."""
    from kimiaudio.bench.random_stack import build_random_stack
    from kimiaudio.checkpoint.paths import resolve_device

    on_gpu = resolve_device(config.model.device).type == "cuda"
    stack = build_random_stack(config, "full" if on_gpu else "tiny")
    stack.detokenizer.prepare_for_serving()
    return stack


def _memory_plan_command(config, args) -> int:
    """`bench --memory-plan`: the plan of the full-size shapes (--random-weights full) or of the
    configured checkpoint's configs, built on the meta device, for server.max_sessions =
    max(--sessions); auto resolved as serve would."""
    import torch

    from kimiaudio.checkpoint.paths import resolve_dtype
    from kimiaudio.pipeline.memory_plan import GIB, plan_memory
    from kimiaudio.pipeline.memory_report import format_memory_plan
    from kimiaudio.pipeline.meta_stack import meta_stack, plan_for_shape
    from kimiaudio.pipeline.model_stack import resolve_checkpoint
    from kimiaudio.pipeline.weights_choice import choose_weights

    if args.random_weights == "7b":
        raise KimiAudioError("--memory-plan plans a whole stack: use --random-weights full or a checkpoint")
    if args.card_gib is not None and not 0 < args.card_gib <= 1 << 20:
        raise KimiAudioError(f"--card-gib {args.card_gib}: expected a positive size in GiB")
    positions = PLAN_POSITIONS if args.positions is None else args.positions
    if positions < 1:
        raise KimiAudioError(f"--positions {positions}: expected a positive number of positions")
    if args.card_gib is None:
        if not torch.cuda.is_available():
            raise KimiAudioError("--memory-plan needs --card-gib N without a GPU (e.g. --card-gib 24)")
        card = torch.cuda.mem_get_info(torch.cuda.current_device())[1]
    else:
        card = int(args.card_gib * GIB)
    # The plan is of a GPU: its dtype, unless one is configured.
    dtype = resolve_dtype(config.model.dtype, torch.device("cuda"))
    text_only = config.model.text_only
    if args.random_weights == "full":

        def plan_of(lm, dit):
            return plan_for_shape("full", config, lm, None if text_only else dit, card, positions, dtype)
    else:
        paths = resolve_checkpoint(config, text_only)

        def plan_of(lm, dit):
            stack = meta_stack(paths, dtype, config, lm, None if text_only else dit)
            return plan_memory(stack, config, card, on_gpu=True, positions=positions)

    plan = choose_weights(config.model.weights, config.detok.weights, True, plan_of)[2]
    print(json.dumps(plan, indent=1) if args.json else format_memory_plan(plan))
    return 0
