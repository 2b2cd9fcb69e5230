"""The engine end to end on the golden tiny checkpoint (float32, CPU) against the batch-1
reference loop (kimiaudio.engine.reference_loop), run one request at a time.

Prompts are the golden LM inputs and variations of them (truncated audio, random codes and
features, joined prompts). A tiny pool (12 blocks of 8) and a small token budget force
chunked prefill, preemption by recompute and batching of prefill with decode; greedy and
seeded sampled outputs must be token-identical to the reference, aborted requests must stop
with the pool drained, and a follow-up prompt must be served from the prefix cache.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kimiaudio.engine.reference_loop import generate_reference
from kimiaudio.engine.request import PromptTooLongError, RequestError
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.models.kimia_lm import KimiAudioLM

from helpers.engine_scenarios import (
    build_requests,
    check_bfloat16_engine,
    engine_for,
    golden_prompt,
    make_request,
    reference_args,
    reference_steps,
    run_scenario,
)


def test_engine_matches_reference_with_chunking_preemption_and_abort(tiny_engine_setup):
    lm, tensors, rules = tiny_engine_setup
    arrivals = build_requests(lm, tensors, rules)
    expected = {req.request_id: reference_steps(lm, req) for _, req in arrivals if req.request_id != "abort-waiting"}
    engine = engine_for(lm)
    outputs, finished = run_scenario(engine, arrivals)
    stats = engine.stats()
    assert stats.num_preemptions > 0  # the tiny pool forced recompute
    assert stats.num_blocks_free == stats.num_blocks_total == 12  # nothing leaked
    assert stats.read_wait_s > 0  # steps launched and read later: the reads were timed
    assert outputs["abort-waiting"] == []
    # ignore_eos runs to the length limit, on both sides, past the stop where the same prompt
    # ended if it did (on golden a it does: test_lm_golden checks where).
    text_steps = expected["text"][0]
    assert len(outputs["fixed-length"]) == 30 > len(text_steps) and finished["fixed-length"] == "length"
    assert outputs["fixed-length"][: len(text_steps)] == text_steps
    assert outputs["abort-running"] == expected["abort-running"][0][:5]
    for rid, (steps, reason) in expected.items():
        if rid.startswith("abort"):
            continue
        assert outputs[rid] == steps, rid
        assert finished[rid] == reason, rid


def test_nucleus_sampling_and_penalties_batched_equal_the_reference(tiny_engine_setup):
    """Not official (OpenAI's): top_p and the presence / frequency penalties, in a batch with
    official requests, sample what the batch-1 reference loop samples."""
    lm, tensors, rules = tiny_engine_setup
    text, both = golden_prompt(tensors, "lm.text"), golden_prompt(tensors, "lm.both")
    nucleus = SamplingParams(
        seed=3,
        text_temperature=1.0,
        text_top_k=0,
        text_top_p=0.7,
        audio_top_p=0.8,
        text_presence_penalty=0.8,
        text_frequency_penalty=0.5,
        max_new_tokens=16,
    )
    arrivals = [
        (0, make_request("nucleus-text", text, nucleus, "text", rules)),
        (0, make_request("nucleus-both", both, nucleus, "both", rules)),
        (1, make_request("greedy", both, SamplingParams.greedy(max_new_tokens=12), "both", rules)),
    ]
    expected = {req.request_id: reference_steps(lm, req) for _, req in arrivals}
    outputs, finished = run_scenario(engine_for(lm, num_blocks=32), arrivals)
    for rid, (steps, reason) in expected.items():
        assert outputs[rid] == steps and finished[rid] == reason, rid


def test_follow_up_prompt_is_served_from_prefix_cache(tiny_engine_setup):
    lm, tensors, rules = tiny_engine_setup
    engine = engine_for(lm, num_blocks=32, budget=64)
    first = make_request(
        "first", golden_prompt(tensors, "lm_e2e"), SamplingParams.greedy(max_new_tokens=20), "both", rules
    )
    engine.add_request(first)
    generated = []
    while engine.has_work():
        generated += [(o.text_token, o.audio_token) for o in engine.step()]
    before = engine.stats()
    # The follow-up: the first prompt, the generated steps as history, three more positions.
    prompt = golden_prompt(tensors, "lm_e2e")
    prompt = dict(
        prompt,
        audio_ids=prompt["audio_ids"] + [a for _, a in generated] + prompt["audio_ids"][-3:],
        text_ids=prompt["text_ids"] + [t for t, _ in generated] + prompt["text_ids"][-3:],
        continuous_mask=prompt["continuous_mask"] + [0] * (len(generated) + 3),
    )
    second = make_request("second", prompt, SamplingParams.greedy(max_new_tokens=6), "both", rules)
    engine.add_request(second)
    steps = []
    # The first request computed K/V for its prompt and every step but the last: the full
    # blocks of those positions are the hit.
    block_size = engine.config.block_size
    cached = (len(first.prompt.audio_ids) + len(generated) - 1) // block_size * block_size
    while engine.has_work():
        steps += engine.step()
    outputs = [(o.text_token, o.audio_token) for o in steps]
    assert cached > 0 and {o.num_cached_tokens for o in steps} == {cached}  # every output reports the admission's hit
    assert {o.num_prompt_tokens for o in steps} == {len(prompt["audio_ids"])}
    after = engine.stats()
    num_positions = len(prompt["audio_ids"])
    assert after.num_prefill_tokens_cached - before.num_prefill_tokens_cached == cached
    assert after.num_prefill_tokens_computed - before.num_prefill_tokens_computed == num_positions - cached
    assert outputs == reference_steps(lm, second)[0]  # the cached K/V is the right K/V
    assert after.num_blocks_free == after.num_blocks_total


def test_bad_requests_fail_alone(tiny_engine_setup):
    lm, tensors, rules = tiny_engine_setup
    engine = engine_for(lm)
    good = golden_prompt(tensors, "lm.both")
    params = SamplingParams.greedy(max_new_tokens=4)
    rows, width = good["features"].shape
    bad = [
        dict(good, features=good["features"][:-1]),  # rows != continuous positions
        dict(good, text_ids=good["text_ids"][:-1]),  # streams of different lengths
        dict(good, audio_ids=[lm.config.vocab_size] + good["audio_ids"][1:]),  # id out of range
        dict(good, features=torch.randn(rows, width + 1)),  # wrong feature width
    ]
    for i, prompt in enumerate(bad):
        with pytest.raises(RequestError):
            engine.add_request(make_request(f"bad{i}", prompt, params, "both", rules))
    # The pool holds fewer positions than engine.max_model_len: a limit past it (prompt + limit
    # - 1 positions, one more than the pool) is held to the pool, a prompt longer is too long.
    pool = engine.stats().num_blocks_total * engine.config.block_size
    assert engine.max_sequence_len == pool < engine.config.max_model_len
    too_many = SamplingParams.greedy(max_new_tokens=pool - len(good["audio_ids"]) + 2)
    seq_id = engine.add_request(make_request("long", good, too_many, "both", rules))
    assert engine.seqs[seq_id].max_num_tokens == pool
    engine.abort(seq_id)
    times = pool // len(good["audio_ids"]) + 1
    longer = dict(good, audio_ids=good["audio_ids"] * times, text_ids=good["text_ids"] * times)
    longer.update(continuous_mask=[0] * len(longer["audio_ids"]), features=None)
    with pytest.raises(PromptTooLongError, match="the KV pool's"):
        engine.add_request(make_request("longer", longer, params, "both", rules))
    # A step that raises fails the requests it ran (blocks freed), and the engine keeps going.
    engine.add_request(make_request("doomed", good, params, "both", rules))
    run = engine.runner.run
    engine.runner.run = lambda plan: 1 / 0
    failed = engine.step()
    engine.runner.run = run
    assert [(o.request_id, o.finished, o.finish_reason) for o in failed] == [("doomed", True, "error")]
    assert "ZeroDivisionError" in failed[0].error and not engine.has_work()
    assert engine.stats().num_blocks_free == 12
    request = make_request("good", good, params, "both", rules)
    engine.add_request(request)
    outputs = []
    while engine.has_work():
        outputs += [(o.text_token, o.audio_token) for o in engine.step()]
    assert outputs == reference_steps(lm, request)[0]
    assert engine.stats().num_blocks_free == 12


def test_finishing_output_carries_the_official_return_values(tiny_engine_setup):
    """The last output of a request holds what the official loop returns (the caller needs
    nothing from the engine's sequences); an abort produces no output at all."""
    lm, tensors, rules = tiny_engine_setup
    engine = engine_for(lm)
    requests = [
        make_request(
            "both", golden_prompt(tensors, "lm.both"), SamplingParams.greedy(max_new_tokens=20), "both", rules
        ),
        make_request(
            "text", golden_prompt(tensors, "lm.text"), SamplingParams.greedy(max_new_tokens=20), "text", rules
        ),
    ]
    aborted = engine.add_request(
        make_request("gone", golden_prompt(tensors, "lm_e2e"), SamplingParams.greedy(max_new_tokens=20), "both", rules)
    )
    for request in requests:
        engine.add_request(request)
    last = {}
    for _ in range(3):
        for out in engine.step():
            assert out.request_id != "gone" or not out.finished
    assert engine.abort(aborted)
    while engine.has_work():
        for out in engine.step():
            assert out.request_id != "gone"
            assert (out.completion is not None) == out.finished
            if out.finished:
                last[out.request_id] = out
    for request in requests:
        reference = generate_reference(lm, *reference_args(request))
        done = last[request.request_id].completion
        assert done.text_tokens == reference.text_tokens and done.audio_tokens == reference.audio_tokens
        assert (
            done.num_steps == reference.num_steps and last[request.request_id].finish_reason == reference.finish_reason
        )
    assert engine.stats().num_blocks_free == 12


def test_bfloat16_engine_serves_a_mixed_batch(monkeypatch, golden_checkpoint, golden, golden_rules):
    check_bfloat16_engine("cpu", monkeypatch, golden_checkpoint, golden, golden_rules)


def test_checkpoint_without_whisper_features_ignores_them(tiny_engine_setup):
    """use_whisper_feature = false (no VQ adaptor): the official model ignores the features it
    is given; so do the engine and the reference loop, rather than failing every turn."""
    lm, tensors, rules = tiny_engine_setup
    config = dataclasses.replace(lm.config, use_whisper_feature=False)
    plain = KimiAudioLM(config).eval().requires_grad_(False)
    plain.fuse_projections()  # as load_lm leaves the golden model
    state = {k: v for k, v in lm.state_dict().items() if "vq_adaptor" not in k}
    plain.load_state_dict(state)
    prompt = golden_prompt(tensors, "lm_e2e")
    params = SamplingParams.greedy(max_new_tokens=8)
    with_features = make_request("with", prompt, params, "both", rules)
    without = make_request(
        "without", dict(prompt, features=None, continuous_mask=[0] * len(prompt["audio_ids"])), params, "both", rules
    )
    engine = engine_for(plain)
    outputs = {}
    for request in (with_features, without):
        engine.add_request(request)
        while engine.has_work():
            for out in engine.step():
                outputs.setdefault(out.request_id, []).append((out.text_token, out.audio_token))
    assert outputs["with"] == outputs["without"] == reference_steps(plain, with_features)[0]
