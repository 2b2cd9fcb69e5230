"""`python -m kimiaudio bench`: throughput and latency of the serving pipeline.

For each concurrency N it runs N synthetic conversations (one or more spoken turns each)
through the real pipeline in this process (no network), then the same turns through the
offline batch-1 reference loop, and prints per N: aggregate and per-session generated
tokens/s, engine step time p50/p95, submit -> first audio chunk p50/p95, per-session
real-time factor, KV blocks used, prefix-cache hit rate, and the speed-up over the reference.
The same seeds are used on both sides, so both generate the same tokens.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from kimiaudio.engine.request import EngineRequest
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.pipeline.request import HistoryTurn, TurnRequest
from kimiaudio.pipeline.worker import configure_worker_thread
from kimiaudio.pipeline.events import AudioChunk, TurnDone
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.text.prompt import Message, build_prompt


@dataclass
class BenchRow:
    sessions: int
    turns: int
    generated_tokens: int
    wall_s: float
    tokens_per_s: float
    tokens_per_s_per_session: float
    lm_step_ms_p50: float  # one engine step on the LM worker, measured while the detokenizer runs
    lm_step_ms_p95: float
    detok_ms_p50: float  # one detokenizer batch (every chunk due in it)
    first_audio_ms_p50: float
    first_audio_ms_p95: float
    rtf_p50: float  # per-session generation time / audio seconds produced (< 1: faster than real time)
    stall_ms_p95: float  # per turn: silence a listener playing from the first chunk hears (0 = never ran dry)
    kv_blocks_used_peak: int
    kv_blocks_total: int
    prefix_cache_hit_rate: float
    reference_tokens_per_s: float | None = None  # offline path: encode, reference loop, detokenize
    reference_generated_tokens: int | None = None  # equal to generated_tokens when both sides agree
    speedup_vs_reference: float | None = None
    lm_tokens_per_s: float | None = None  # LM alone: the engine ...
    lm_reference_tokens_per_s: float | None = None  # ... and the batch-1 reference loop
    lm_generated_tokens: int | None = None  # by the engine ...
    lm_reference_generated_tokens: int | None = None  # ... and by the reference loop
    lm_speedup: float | None = None


def synthetic_speech(seconds: float, seed: int, sr: int = 16000) -> np.ndarray:
    """A voiced, speech-like signal: a glottal-pulse harmonic series with a wandering pitch
    and syllable-rate amplitude envelope (distinct per seed, so encoders see real variety)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    f0 = 110 + 40 * rng.random() + 20 * np.sin(2 * np.pi * 0.7 * t + rng.random() * 6)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voice = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = np.clip(np.sin(2 * np.pi * 3.5 * t + rng.random() * 6), 0, None) ** 0.5
    pcm = 0.3 * voice * envelope / np.max(np.abs(voice)) + 0.003 * rng.standard_normal(t.size)
    return pcm.astype(np.float32)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values), q))


class PlaybackClock:
    """A listener who starts playing at the first chunk and plays without pausing: the
    seconds of silence it hears because a chunk came after the audio before it ran out."""

    def __init__(self, sample_rate: int):
        self.sample_rate = sample_rate
        self.played_until: float | None = None
        self.stall_s = 0.0
        self.samples = 0

    def arrive(self, now: float, num_samples: int) -> None:
        if self.played_until is None:
            self.played_until = now
        elif now > self.played_until:
            self.stall_s += now - self.played_until
            self.played_until = now
        self.played_until += num_samples / self.sample_rate
        self.samples += num_samples


async def _run_session(pipeline: Pipeline, inputs: list[np.ndarray], params: SamplingParams, sr_out: int) -> dict:
    history: list[HistoryTurn] = []
    stats = {"tokens": 0, "first_audio": [], "rtf": [], "stall": []}
    for turn, pcm in enumerate(inputs):
        handle = pipeline.submit(TurnRequest("bench", list(history), pcm, params))
        clock, done = PlaybackClock(sr_out), None
        async for event in handle:
            if isinstance(event, AudioChunk):
                clock.arrive(time.perf_counter(), event.pcm.size)
            elif isinstance(event, TurnDone):
                done = event
        samples = clock.samples
        stats["stall"].append(clock.stall_s)
        if done is None or done.status != "completed":
            raise KimiAudioError(f"bench turn failed: {done.error if done else 'no result'}")
        stats["tokens"] += len(done.text_tokens)  # one text token per generated position
        if "first_pcm_s" in done.timings:
            stats["first_audio"].append(done.timings["first_pcm_s"])
        if samples:
            busy = done.timings["done_s"] - done.timings.get("encoded_s", 0.0)
            stats["rtf"].append(busy / (samples / sr_out))
        history += [HistoryTurn("user", audio=pcm), HistoryTurn("assistant", text=done.text, audio_tokens=done.audio_tokens)]
    return stats


async def _bench_pipeline(stack, config, n: int, inputs: list[list[np.ndarray]], params: list[SamplingParams]) -> BenchRow:
    pipeline = Pipeline(stack, config)
    await pipeline.start()
    try:
        start = time.perf_counter()
        results = await asyncio.gather(*[
            _run_session(pipeline, inputs[i], params[i], stack.detokenizer.sample_rate) for i in range(n)])
        wall = time.perf_counter() - start
        s = pipeline.stats()
    finally:
        await pipeline.stop()
    tokens = sum(r["tokens"] for r in results)
    first = [x for r in results for x in r["first_audio"]]
    rtf = [x for r in results for x in r["rtf"]]
    stalls = [x for r in results for x in r["stall"]]
    m = pipeline.metrics
    cached, computed = s["prefill_tokens_cached"], s["prefill_tokens_computed"]
    return BenchRow(
        sessions=n, turns=len(inputs[0]), generated_tokens=tokens, wall_s=wall, tokens_per_s=tokens / wall,
        tokens_per_s_per_session=tokens / wall / n,
        lm_step_ms_p50=1000 * m.lm_step_s.percentile(50), lm_step_ms_p95=1000 * m.lm_step_s.percentile(95),
        detok_ms_p50=1000 * m.detok_batch_s.percentile(50),
        first_audio_ms_p50=1000 * _percentile(first, 50), first_audio_ms_p95=1000 * _percentile(first, 95),
        rtf_p50=_percentile(rtf, 50), stall_ms_p95=1000 * _percentile(stalls, 95),
        kv_blocks_used_peak=s["kv_blocks_total"] - (m.min_free_blocks if m.min_free_blocks is not None else s["kv_blocks_total"]), kv_blocks_total=s["kv_blocks_total"],
        prefix_cache_hit_rate=cached / max(cached + computed, 1),
    )


def _bench_reference(stack, inputs: list[list[np.ndarray]], params: list[SamplingParams]) -> tuple[int, float]:
    """Generated tokens and tokens/s of the offline path (encode, batch-1 reference loop, offline
    detokenizer) on the same turns, one session after another."""
    from kimiaudio.pipeline.offline import user_audio_message

    tokens, seconds = _reference_run(stack, inputs, params, lambda pcm: user_audio_message(stack, pcm)[0], speak=True)
    return tokens, tokens / seconds


def _reference_run(stack, sessions: list[list], params: list[SamplingParams], user_message,
                   speak: bool) -> tuple[int, float]:
    """(generated positions, seconds) of every session's turns through the batch-1 reference
    loop, one session after another; `user_message(x)` makes each user turn's Message."""
    from kimiaudio.pipeline.offline import answer

    tokens, start = 0, time.perf_counter()
    for session, p in zip(sessions, params):
        history: list[Message] = []
        for x in session:
            history.append(user_message(x))
            turn = answer(stack, history, p, "both", speak=speak)
            tokens += turn.num_steps
            history.append(turn.history_message(stack.specials.token_offset))
    return tokens, time.perf_counter() - start


LM_REPEATS = 3  # the LM-alone runs are short: best of three on each side steadies the ratio


def _bench_lm(stack, config, inputs: list[list[np.ndarray]], params: list[SamplingParams],
              repeats: int = LM_REPEATS) -> tuple[int, float, int, float]:
    """Generated positions and positions/s of the LM alone on the same conversations: the
    engine with every session submitting its next turn as soon as its answer ends (a closed
    loop, as users talk), and the batch-1 reference loop, one turn after another; the best of
    `repeats` runs each. Speech is encoded beforehand, outside both timings.

    Every turn runs to the length limit past its stop tokens (`ignore_eos`, as vLLM's
    throughput benchmark), so all N sessions stay in the batch for the whole run: the ratio is
    the engine's at N concurrent sessions. With natural lengths the run ends in a tail where
    the last long replies run almost alone: 16 demo sessions of 2 turns averaged 11 sequences
    per step (1134 positions in 100 steps)."""
    params = [replace(p, ignore_eos=True) for p in params]
    flat = stack.encode_speech_batch([pcm for session in inputs for pcm in session])
    turns = len(inputs[0])
    users = [[Message("user", "audio", audio_tokens=c, features=f) for c, f in flat[i * turns:(i + 1) * turns]]
             for i in range(len(inputs))]
    engine_tokens, engine_s = min((_lm_engine_run(stack, config, users, params) for _ in range(repeats)),
                                  key=lambda run: run[1])
    reference_tokens, reference_s = min((_reference_run(stack, users, params, lambda user: user, speak=False)
                                         for _ in range(repeats)), key=lambda run: run[1])
    return engine_tokens, engine_tokens / engine_s, reference_tokens, reference_tokens / reference_s


def _lm_engine_run(stack, config, users: list[list[Message]], params: list[SamplingParams]) -> tuple[int, float]:
    """(generated positions, seconds) of every session's turns through a fresh engine."""
    from kimiaudio.engine.llm_engine import LLMEngine
    from kimiaudio.pipeline.offline import TurnResult

    offset = stack.specials.token_offset
    engine = LLMEngine(stack.lm, config.engine, stack.device, stack.dtype)
    histories: list[list[Message]] = [[] for _ in users]
    live: dict[str, int] = {}  # request id -> session

    def submit(session: int) -> None:
        turn = len(histories[session]) // 2
        histories[session].append(users[session][turn])
        prompt = build_prompt(histories[session], "both", stack.tokenizer, stack.specials)
        request_id = f"{session}.{turn}"
        engine.add_request(EngineRequest(request_id, prompt.audio_ids, prompt.text_ids,
                                                  prompt.continuous_mask, prompt.features_tensor(), params[session],
                                                  "both", stack.specials))
        live[request_id] = session

    tokens, start = 0, time.perf_counter()
    for session in range(len(users)):
        submit(session)
    while engine.has_work():
        for out in engine.step():
            tokens += out.text_token is not None
            if not out.finished:
                continue
            session = live.pop(out.request_id)
            if out.finish_reason == "error":
                raise KimiAudioError(f"bench LM turn failed: {out.error}")
            done = out.completion
            reply = TurnResult.from_tokens(stack, done.text_tokens, done.audio_tokens, out.finish_reason, done.num_steps)
            histories[session].append(reply.history_message(offset))
            if len(histories[session]) < 2 * len(users[session]):
                submit(session)
    return tokens, time.perf_counter() - start


@contextmanager
def _torch_threads(device, threads: int):
    """The worker thread's CPU thread count (engine.cpu_threads) for this thread's work too,
    so both sides of a comparison run with the same setting."""
    previous = torch.get_num_threads()
    configure_worker_thread(device, threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _warm_up(stack, config, reference: bool) -> None:
    """One short untimed conversation through every timed path, so that lazy initialisation
    (allocator growth, kernel selection) does not land in the first row."""
    inputs = [[synthetic_speech(1.5, seed=99)]]
    params = [SamplingParams.from_config(config.sampling, seed=99, max_new_tokens=16)]
    asyncio.run(_bench_pipeline(stack, config, 1, inputs, params))
    if reference:
        with _torch_threads(stack.device, config.engine.cpu_threads):
            _bench_reference(stack, inputs, params)
            _bench_lm(stack, config, inputs, params, repeats=1)


def run_bench(stack, config, sessions: list[int], turns: int, max_new_tokens: int,
              speech: list[np.ndarray] | None = None, reference: bool = True, progress: bool = True) -> list[BenchRow]:
    rows = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(sessions) * (2 if reference else 1), desc="bench", unit="run")
    _warm_up(stack, config, reference)
    for n in sessions:
        inputs = [[speech[(i + k) % len(speech)] if speech else synthetic_speech(2.0 + (i + k) % 3, seed=i * 31 + k)
                   for k in range(turns)] for i in range(n)]
        # Ignore stop tokens' randomness across runs: fixed per-session seeds on both sides.
        params = [SamplingParams.from_config(config.sampling, seed=1000 + i, max_new_tokens=max_new_tokens)
                  for i in range(n)]
        row = asyncio.run(_bench_pipeline(stack, config, n, inputs, params))
        if bar:
            bar.update()
        if reference:
            # Every session, not a sample: replies differ in how much speech each position carries.
            with _torch_threads(stack.device, config.engine.cpu_threads):
                row.reference_generated_tokens, row.reference_tokens_per_s = _bench_reference(stack, inputs, params)
                (row.lm_generated_tokens, row.lm_tokens_per_s, row.lm_reference_generated_tokens,
                 row.lm_reference_tokens_per_s) = _bench_lm(stack, config, inputs, params)
            row.speedup_vs_reference = row.tokens_per_s / row.reference_tokens_per_s
            row.lm_speedup = row.lm_tokens_per_s / row.lm_reference_tokens_per_s
            if bar:
                bar.update()
        rows.append(row)
    if bar:
        bar.close()
    return rows


def format_rows(rows: list[BenchRow]) -> str:
    head = (f"{'N':>4} {'tok/s':>8} {'tok/s/ses':>9} {'LM step p50':>11} {'p95':>8} {'detok p50':>9} {'1st audio p50':>13} "
            f"{'p95':>8} {'RTF p50':>8} {'stall p95':>9} {'KV used':>9} {'hit rate':>8} {'ref tok/s':>9} {'speedup':>8} "
            f"{'LM tok/s':>9} {'LM ref':>8} {'LM speedup':>10}")
    lines = [head]
    for r in rows:
        ref = (f"{r.reference_tokens_per_s:9.1f} {r.speedup_vs_reference:7.1f}x {r.lm_tokens_per_s:9.1f} "
               f"{r.lm_reference_tokens_per_s:8.1f} {r.lm_speedup:9.1f}x") if r.reference_tokens_per_s else ""
        lines.append(
            f"{r.sessions:>4} {r.tokens_per_s:8.1f} {r.tokens_per_s_per_session:9.1f} {r.lm_step_ms_p50:9.1f}ms "
            f"{r.lm_step_ms_p95:6.1f}ms {r.detok_ms_p50:7.1f}ms {r.first_audio_ms_p50:11.0f}ms {r.first_audio_ms_p95:6.0f}ms {r.rtf_p50:8.2f} "
            f"{r.stall_ms_p95:7.0f}ms "
            f"{r.kv_blocks_used_peak:>4}/{r.kv_blocks_total:<4} {r.prefix_cache_hit_rate:8.2f} {ref}")
    return "\n".join(lines)


def run_bench_command(config, args) -> int:
    from kimiaudio.audio.io import load_audio
    from kimiaudio.pipeline.model_stack import DEMO_NOTICE, ModelStack, freeze_loaded_objects

    try:
        sessions = [int(x) for x in args.sessions.split(",") if x.strip()]
    except ValueError:
        raise KimiAudioError(f"--sessions {args.sessions!r}: expected comma-separated integers, e.g. 1,4,16") from None
    if not sessions or min(sessions) < 1 or args.turns < 1:
        raise KimiAudioError("--sessions and --turns must be positive")
    if args.random_weights:
        from kimiaudio.bench.decode_7b import run_random_7b

        return run_random_7b(config, sessions, args)
    stack = ModelStack.load(config, progress=not args.json)
    if stack.detokenizer is None:
        raise KimiAudioError("bench needs the detokenizer: set model.text_only = false")
    freeze_loaded_objects()
    speech = [load_audio(path) for path in args.speech] or None
    if args.http:
        from kimiaudio.bench.http_bench import print_rows, run_http_bench

        if stack.is_demo and not args.json:
            print(DEMO_NOTICE)
        print_rows(run_http_bench(stack, config, sessions, args.turns, speech, args.max_new_tokens), args.json)
        return 0
    if args.webrtc:
        from kimiaudio.bench.webrtc import print_rows, run_webrtc_bench

        if stack.is_demo and not args.json:
            print(DEMO_NOTICE)
        print_rows(run_webrtc_bench(stack, config, sessions, args.turns, speech, args.max_new_tokens), args.json)
        return 0
    rows = run_bench(stack, config, sessions, args.turns, args.max_new_tokens, speech,
                     reference=not args.no_reference, progress=not args.json)
    info = {"device": str(stack.device), "dtype": str(stack.dtype).replace("torch.", ""), "demo_weights": stack.is_demo,
            "model": str(stack.paths.root), "max_new_tokens": args.max_new_tokens, "turns": args.turns}
    if args.json:
        print(json.dumps({**info, "rows": [asdict(r) for r in rows]}, indent=1))
    else:
        if stack.is_demo:
            print(DEMO_NOTICE)
        print(f"device {info['device']} dtype {info['dtype']}, at most {args.max_new_tokens} new positions per turn, "
              f"{args.turns} turn(s) per session; reference = the same sessions through the batch-1 loop, one by one")
        print(format_rows(rows))
        print("tok/s = generated positions (one text + one audio token each) per second. speedup: the whole "
              "pipeline vs encode + reference loop + offline detokenizer; LM speedup: engine vs reference loop "
              "alone, every turn running to its new-position limit (stop tokens ignored).")
    return 0
