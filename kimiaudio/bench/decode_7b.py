"""`bench --random-weights 7b`: engine decode steps with the real Kimi-Audio-7B shapes.

Random bf16 weights in the official config's shapes (KIMI_AUDIO_REFERENCE.md §1), no files.
For each batch size B it keeps B sequences decoding and times engine steps, then compares
the step time with the weight-bandwidth floor: the bytes of weights one decode step must read
(every trunk and MIMO layer plus both heads) divided by the device's measured copy bandwidth.
Only the LM is built here; first-audio latency is measured by the pipeline bench.
"""

from __future__ import annotations

import json
import time

import numpy as np
import torch

from kimiaudio.config import EngineConfig
from kimiaudio.engine.llm_engine import LLMEngine
from kimiaudio.engine.request import EngineRequest
from kimiaudio.errors import KimiAudioError
from kimiaudio.engine.stop_rules import RuleTokens
from kimiaudio.models.kimia_config import KimiaConfig
from kimiaudio.models.kimia_lm import KimiAudioLM
from kimiaudio.engine.sampling_params import SamplingParams

# config.json of moonshotai/Kimi-Audio-7B-Instruct (shapes only; ids from the official defaults).
KIMI_AUDIO_7B = dict(
    hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
    num_key_value_heads=4, vocab_size=168448, kimia_mimo_layers=6, kimia_mimo_transformer_from_layer_index=21,
    kimia_token_offset=152064, kimia_adaptor_input_dim=5120, rms_norm_eps=1e-6, rope_theta=1e6,
    max_position_embeddings=8192,
)
SPECIALS_7B = RuleTokens(text_blank=151666, text_eos=151667, msg_end=151645, media_end=151663)
PROMPT_LEN = 128


def random_lm(config: KimiaConfig, device: torch.device, dtype: torch.dtype, seed: int = 0) -> KimiAudioLM:
    """The LM with N(0, 0.02) weights (norm weights 1), allocated once on the device."""
    with torch.device("meta"):
        lm = KimiAudioLM(config)
    lm = lm.to(dtype).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in lm.named_parameters():
            if param.dim() == 1:
                param.fill_(1.0 if "norm" in name else 0.0)  # norm weights 1, biases 0
            else:
                param.normal_(0.0, 0.02, generator=gen)
    return lm.fuse_projections().eval().requires_grad_(False)


def decode_weight_bytes(lm: KimiAudioLM) -> int:
    """Bytes one decode step reads: all parameters except the two embedding lookups' tables
    (only B rows of embed_tokens are read) and the VQ adaptor (prefill only)."""
    skip = ("embed_tokens", "vq_adaptor")
    return sum(p.numel() * p.element_size() for n, p in lm.named_parameters() if not any(s in n for s in skip))


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Bytes/s of a device-to-device copy (read + write counted)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    _sync(device)
    start, reps = time.perf_counter(), 10
    for _ in range(reps):
        dst.copy_(src)
    _sync(device)
    return 2 * nbytes * reps / (time.perf_counter() - start)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_decode(lm: KimiAudioLM, engine_cfg: EngineConfig, device, dtype, batch: int, steps: int) -> list[float]:
    """Step times (s) of `steps` decode steps with `batch` sequences running."""
    engine = LLMEngine(lm, engine_cfg, device, dtype)
    gen = np.random.default_rng(batch)
    # ignore_eos: random weights may sample msg_end, and every step must run the whole batch.
    params = SamplingParams(audio_temperature=0.8, audio_top_k=10, seed=1, max_new_tokens=steps + 16, ignore_eos=True)
    blank = SPECIALS_7B.text_blank
    for i in range(batch):
        audio = gen.integers(lm.config.kimia_token_offset, lm.config.vocab_size, PROMPT_LEN).tolist()  # speech codes
        engine.add_request(EngineRequest(f"r{i}", audio, [blank] * PROMPT_LEN, [0] * PROMPT_LEN, None, params,
                                         "both", SPECIALS_7B))
    while engine.stats().num_waiting or engine.stats().num_decode_tokens == 0:
        engine.step()  # prefill (chunked) until every sequence decodes
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        outputs = engine.step()  # ends in one .tolist(): the step is synchronised
        times.append(time.perf_counter() - start)
        if len(outputs) != batch:
            raise KimiAudioError(f"decode bench: a step ran {len(outputs)} of {batch} sequences")
    return times


def run_random_7b(config, sessions: list[int], args, shape: dict | None = None) -> int:
    from kimiaudio.checkpoint.paths import resolve_device, resolve_dtype

    device = resolve_device(config.model.device)
    if device.type != "cuda" and shape is None:
        raise KimiAudioError("--random-weights 7b needs a CUDA GPU (about 22 GB); pass --device cuda")
    dtype = resolve_dtype(config.model.dtype, device)
    lm_config = KimiaConfig.from_dict(shape or KIMI_AUDIO_7B, "random-weights-7b")
    lm = random_lm(lm_config, device, dtype)
    weight_bytes = decode_weight_bytes(lm)
    bandwidth = copy_bandwidth(device, 1 << 30 if device.type == "cuda" else 1 << 24)
    floor = weight_bytes / bandwidth
    engine_cfg = EngineConfig(**{**vars(config.engine), "max_num_seqs": max(sessions),
                                 "max_model_len": PROMPT_LEN + 256})
    rows = []
    for batch in sessions:
        times = time_decode(lm, engine_cfg, device, dtype, batch, steps=32)[4:]  # skip warm-up steps
        p50 = float(np.percentile(times, 50))
        rows.append({"batch": batch, "step_ms_p50": 1e3 * p50, "step_ms_p95": 1e3 * float(np.percentile(times, 95)),
                     "floor_ms": 1e3 * floor, "ratio_to_floor": p50 / floor, "tokens_per_s": batch / p50})
    info = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "dtype": str(dtype).replace("torch.", ""), "decode_weight_gb": weight_bytes / 1e9,
            "copy_bandwidth_gb_s": bandwidth / 1e9, "rows": rows}
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"{info['device']} {info['dtype']}: {info['decode_weight_gb']:.2f} GB of weights per decode step, "
          f"copy bandwidth {info['copy_bandwidth_gb_s']:.0f} GB/s -> floor {1e3 * floor:.2f} ms")
    print(f"{'batch':>5} {'step p50':>9} {'step p95':>9} {'x floor':>8} {'tok/s':>9}")
    for r in rows:
        print(f"{r['batch']:>5} {r['step_ms_p50']:7.2f}ms {r['step_ms_p95']:7.2f}ms {r['ratio_to_floor']:8.2f} "
              f"{r['tokens_per_s']:9.0f}")
    return 0
