"""The engine's test scenarios on the golden tiny checkpoint: prompts from the goldens and
variations of them, requests arriving over steps, and the batch-1 reference loop's steps."""

from __future__ import annotations

from pathlib import Path

import torch

from kimiaudio.checkpoint.paths import CheckpointPaths
from kimiaudio.config import EngineConfig
from kimiaudio.engine.llm_engine import LLMEngine
from kimiaudio.engine.paged_attention import AttentionMetadata
from kimiaudio.engine.reference_loop import iter_reference
from kimiaudio.engine.request import EngineRequest, RequestPrompt
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.engine.stop_rules import RuleTokens
from kimiaudio.models.kimia_lm import load_lm


def load_tiny_lm(checkpoint: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """A golden tiny checkpoint through the project's loader."""
    return load_lm(CheckpointPaths(root=checkpoint, glm_tokenizer=checkpoint / "glm-4-voice-tokenizer"), device, dtype)


def golden_prompt(tensors, section: str) -> dict:
    return dict(
        audio_ids=tensors[f"{section}.input.audio_input_ids"][0].tolist(),
        text_ids=tensors[f"{section}.input.text_input_ids"][0].tolist(),
        continuous_mask=tensors[f"{section}.input.is_continuous_mask"][0].tolist(),
        features=tensors[f"{section}.input.whisper_feature"][0],
    )


def truncated(prompt: dict, keep_audio: int) -> dict:
    """Drop the continuous (audio-code) positions after the first `keep_audio`, and their rows."""
    cont = [i for i, m in enumerate(prompt["continuous_mask"]) if m]
    drop = set(cont[keep_audio:])
    keep = [i for i in range(len(prompt["audio_ids"])) if i not in drop]
    return dict(
        audio_ids=[prompt["audio_ids"][i] for i in keep],
        text_ids=[prompt["text_ids"][i] for i in keep],
        continuous_mask=[prompt["continuous_mask"][i] for i in keep],
        features=prompt["features"][:keep_audio],
    )


def shuffled(prompt: dict, seed: int, token_offset: int, vocab: int) -> dict:
    """Same layout, random audio codes and random features at the continuous positions."""
    gen = torch.Generator().manual_seed(seed)
    audio = list(prompt["audio_ids"])
    for i, m in enumerate(prompt["continuous_mask"]):
        if m:
            audio[i] = int(torch.randint(token_offset, vocab, (1,), generator=gen))
    features = torch.randn(prompt["features"].shape, generator=gen)
    return dict(prompt, audio_ids=audio, features=features)


def joined(first: dict, second: dict, first_len: int) -> dict:
    """first's leading positions (no continuous ones among them), then all of second."""
    if any(first["continuous_mask"][:first_len]):
        raise ValueError("joined() expects no continuous positions in the leading part")
    return dict(
        audio_ids=first["audio_ids"][:first_len] + second["audio_ids"],
        text_ids=first["text_ids"][:first_len] + second["text_ids"],
        continuous_mask=first["continuous_mask"][:first_len] + second["continuous_mask"],
        features=second["features"],
    )


def make_request(request_id: str, prompt: dict, params, output_type: str, rules: RuleTokens) -> EngineRequest:
    return EngineRequest(
        request_id,
        RequestPrompt(prompt["audio_ids"], prompt["text_ids"], prompt["continuous_mask"], prompt["features"]),
        params,
        output_type,
        rules,
    )


def reference_args(request: EngineRequest) -> tuple:
    """An engine request's prompt and settings as the reference loop takes them, after `lm`."""
    prompt = request.prompt
    return (
        prompt.audio_ids,
        prompt.text_ids,
        prompt.continuous_mask,
        prompt.features,
        request.params,
        request.output_type,
        request.specials,
    )


def reference_steps(lm, request: EngineRequest) -> tuple[list[tuple[int, int]], str | None]:
    """(text, audio) after the rules for every step of the batch-1 reference loop, and its reason."""
    steps = list(iter_reference(lm, *reference_args(request)))
    return [(s.text_token, s.audio_token) for s in steps], steps[-1].reason


def engine_for(lm, num_blocks=12, block_size=8, budget=24, max_num_seqs=8, overlap_steps=True):
    config = EngineConfig(
        block_size=block_size,
        num_kv_blocks=num_blocks,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        overlap_steps=overlap_steps,
    )
    return LLMEngine(lm, config, "cpu", torch.float32)


def build_requests(lm, tensors, rules):
    both, text, e2e = (golden_prompt(tensors, s) for s in ("lm.both", "lm.text", "lm_e2e"))
    offset, vocab = lm.config.kimia_token_offset, lm.config.vocab_size
    num_audio = sum(e2e["continuous_mask"])  # the golden utterance's codes
    leading = text["continuous_mask"].index(1) // 2  # inside the instruction, before any audio
    greedy = SamplingParams.greedy(max_new_tokens=20)
    sampled = SamplingParams(seed=11, text_temperature=0.7, max_new_tokens=24)
    penalised = SamplingParams(
        seed=5,
        text_temperature=1.0,
        text_top_k=0,
        text_repetition_penalty=1.2,
        text_repetition_window=3,
        audio_repetition_penalty=1.3,
        audio_repetition_window=4,
        max_new_tokens=18,
    )
    specs = [  # (arrival step, request id, prompt, params, output type)
        (0, "both", both, greedy, "both"),
        (0, "text", text, greedy, "text"),
        (0, "e2e", e2e, greedy, "both"),
        (2, "trunc", truncated(e2e, num_audio * 3 // 7), greedy, "both"),
        (2, "random-codes", shuffled(both, 1, offset, vocab), greedy, "both"),
        (5, "joined", joined(text, both, leading), greedy, "text"),
        (5, "sampled", e2e, sampled, "both"),
        (9, "penalised", shuffled(both, 2, offset, vocab), penalised, "both"),
        (9, "abort-running", truncated(e2e, num_audio * 2 // 3), greedy, "both"),
        (9, "abort-waiting", e2e, greedy, "both"),
        (9, "fixed-length", text, SamplingParams.greedy(max_new_tokens=30, ignore_eos=True), "text"),
    ]
    return [(step, make_request(rid, prompt, params, kind, rules)) for step, rid, prompt, params, kind in specs]


def run_scenario(engine: LLMEngine, arrivals: list) -> tuple[dict, dict]:
    """Requests arrive at their steps; "abort-waiting" is aborted at once, "abort-running" after 5
    tokens (a second abort of it finds nothing). -> (tokens per request, finish reason per request);
    the engine ends idle with every KV block free."""
    arrivals = list(arrivals)
    seq_ids, outputs, finished = {}, {req.request_id: [] for _, req in arrivals}, {}
    step = 0
    while step < 400 and (arrivals or engine.has_work()):
        for item in [a for a in arrivals if a[0] <= step]:
            seq_ids[item[1].request_id] = engine.add_request(item[1])
            arrivals.remove(item)
        for rid, after in (("abort-waiting", 0), ("abort-running", 5)):
            if rid in seq_ids and rid not in finished and len(outputs[rid]) >= after:
                assert engine.abort(seq_ids[rid])
                assert not engine.abort(seq_ids[rid])  # already gone
                finished[rid] = "abort"
        for out in engine.step():
            assert out.error is None and out.request_id not in finished
            outputs[out.request_id].append((out.text_token, out.audio_token))
            if out.finished:
                finished[out.request_id] = out.finish_reason
        step += 1
    assert not engine.has_work() and engine.stats().num_blocks_free == engine.stats().num_blocks_total
    return outputs, finished


def check_bfloat16_engine(device, monkeypatch, checkpoint, tensors, rules):
    """The GPU dtype: KV pool and additive decode mask in bfloat16, a mixed batch of three
    fixed-length requests decoded together, the pool drained afterwards."""
    lm = load_tiny_lm(checkpoint, device, torch.bfloat16)
    masks = []
    build = AttentionMetadata.build

    def recording_build(*args, **kwargs):
        meta = build(*args, **kwargs)
        masks.append(None if meta.decode is None else meta.decode.mask)
        return meta

    monkeypatch.setattr(AttentionMetadata, "build", staticmethod(recording_build))
    engine = LLMEngine(
        lm, EngineConfig(block_size=8, num_kv_blocks=40, max_num_batched_tokens=32), device, torch.bfloat16
    )
    assert engine.runner.pool.kv.dtype == torch.bfloat16
    for i, section in enumerate(("lm.both", "lm.text", "lm_e2e")):
        params = SamplingParams(seed=i, max_new_tokens=12, ignore_eos=True)
        engine.add_request(make_request(str(i), golden_prompt(tensors, section), params, "both", rules))
    steps, seen = 0, {}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            seen[out.request_id] = seen.get(out.request_id, 0) + 1
        steps += 1
    assert seen == {"0": 12, "1": 12, "2": 12} and steps < 36  # decodes ran batched
    decode_masks = [m for m in masks if m is not None]
    assert decode_masks and all(m.dtype == torch.bfloat16 for m in decode_masks)
    assert engine.stats().num_blocks_free == 40
