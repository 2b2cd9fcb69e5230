"""The device memory plan: what is fixed, what grows per session, and what is left for the LM's
KV pool, which is sized last; and the `weights = auto` choice made from it before loading.

Fixed: every component's weights, the detokenizer's static batch buffers and CUDA graph pool
(known once prepare_for_serving ran). Per session: the detokenizer's prefix K/V at its cap
(max_kv_cache_frames) plus the vocoder overlap it holds; per LM token, its K/V in every trunk
and MIMO layer. The KV pool gets what is left of the card after those and a headroom; the plan
fits when that pool holds `positions` tokens for each of `sessions` sessions.

`memory_budget` plans a loaded stack; `meta_stack` builds the same parts from a checkpoint's
config files on the "meta" device (shapes and dtypes, no memory, quantized as chosen), so the
same function plans a card before anything is loaded: `bench --memory-plan` and `auto`.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from kimiaudio.checkpoint.paths import CheckpointPaths
from kimiaudio.layers.device_memory import GIB, capacity_bytes
from kimiaudio.layers.fp8 import fp8_supported, require_fp8

log = logging.getLogger(__name__)

HEADROOM = 4 * GIB  # activations, CUDA context, the LM's graph pool, allocator slack


def _bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))


def memory_budget(
    stack,
    sessions: int,
    device_bytes: int | None = None,
    graphs: dict | None = None,
    headroom_bytes: int = HEADROOM,
    positions: int | None = None,
) -> dict:
    """Bytes by item for `sessions` concurrent sessions. `device_bytes`: the card's total (None:
    no KV pool line); `graphs`: Detokenizer.prepare_for_serving()'s report; `positions`: the
    positions each session must be able to hold (None: no `fits`)."""
    weights = {
        "lm": _bytes(stack.lm),
        "whisper": _bytes(stack.whisper.encoder),
        "glm4_tokenizer": _bytes(stack.glm4.model),
    }
    detok = stack.detokenizer
    plan: dict = {
        "weights": weights,
        "sessions": sessions,
        "weights_choice": {"lm": getattr(stack.lm, "weights", "bf16")},
    }
    fixed = sum(weights.values())
    if detok is not None:
        weights.update(dit=_bytes(detok.dit), vocoder=_bytes(detok.vocoder))
        plan["weights_choice"]["dit"] = getattr(detok.dit, "weights", "bf16")
        fixed += weights["dit"] + weights["vocoder"]
        graph_bytes = (graphs or {}).get("added_bytes", 0)
        plan.update(
            detok_static_buffers=detok.flow.arena.nbytes,
            detok_graph_pool=graph_bytes,
            detok_state_per_session=detok.state_bytes_per_stream(),
            detok_state_all_sessions=sessions * detok.state_bytes_per_stream(),
        )
        fixed += detok.flow.arena.nbytes + graph_bytes + plan["detok_state_all_sessions"]
    cfg = stack.lm.config
    plan["weights_total_bytes"] = sum(weights.values())
    plan["lm_kv_per_token"] = cfg.num_kv_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * stack.lm.dtype.itemsize
    plan["fixed_total"] = fixed
    if device_bytes is not None:
        plan.update(
            device_total=device_bytes, headroom=headroom_bytes, kv_pool=max(0, device_bytes - fixed - headroom_bytes)
        )
        plan["kv_pool_tokens"] = plan["kv_pool"] // plan["lm_kv_per_token"]
        plan["tokens_per_session"] = plan["kv_pool_tokens"] // max(1, sessions)
        if positions is not None:
            plan.update(positions_per_session=positions, fits=plan["kv_pool_tokens"] >= sessions * positions)
    return plan


@dataclass
class _Part:
    """What memory_budget reads of a speech encoder: its module."""

    encoder: torch.nn.Module | None = None
    model: torch.nn.Module | None = None


@dataclass
class MetaStack:
    lm: torch.nn.Module
    whisper: _Part
    glm4: _Part
    detokenizer: object | None


def meta_stack(
    paths: CheckpointPaths, dtype: torch.dtype, detok_cfg, lm_weights: str, dit_weights: str | None, sessions: int
) -> MetaStack:
    """The parts `paths`' config files describe, on the meta device, as the loaders would leave
    them (projections fused; LM and DiT quantized as chosen; the GLM encoder in float32).
    dit_weights None: text only. The detokenizer batches at most `sessions` streams."""
    from transformers import WhisperConfig

    from kimiaudio.audio.glm4_tokenizer import Glm4SpeechTokenizer
    from kimiaudio.audio.whisper_features import WhisperFeatureEncoder
    from kimiaudio.audio.whisper_vq_encoder import WhisperVQConfig
    from kimiaudio.checkpoint.files import read_json
    from kimiaudio.models.kimia_config import KimiaConfig
    from kimiaudio.models.kimia_lm import KimiAudioLM
    from kimiaudio.models.quantize import quantize_dit, quantize_lm

    with torch.device("meta"):
        lm = KimiAudioLM(KimiaConfig.from_file(paths.lm_config)).to(dtype)
    lm = quantize_lm(lm.fuse_projections(), lm_weights)
    whisper = WhisperFeatureEncoder.empty_encoder(
        WhisperConfig(**read_json(paths.whisper / "config.json")), "meta", dtype
    )
    glm = Glm4SpeechTokenizer.empty_model(WhisperVQConfig.from_file(paths.glm_tokenizer / "config.json"), "meta")
    detok = None
    if dit_weights is not None:
        from kimiaudio.detok.detokenizer import Detokenizer
        from kimiaudio.models.bigvgan import BigVGAN, VocoderConfig
        from kimiaudio.models.dit import DiTPrefix
        from kimiaudio.models.dit_config import DiTConfig

        with torch.device("meta"):
            dit = DiTPrefix(DiTConfig.from_yaml(paths.detokenizer / "config.yaml")).to(dtype)
            vocoder = BigVGAN(VocoderConfig.from_json(paths.vocoder / "config.json")).to(dtype).fold_weight_norm()
        batch = min(detok_cfg.max_batch_sessions, max(1, sessions))  # no bigger batch can form
        detok = Detokenizer(quantize_dit(dit, dit_weights), vocoder, replace(detok_cfg, max_batch_sessions=batch))
    return MetaStack(lm, _Part(encoder=whisper), _Part(model=glm), detok)


def plan_for_shape(
    shape: str,
    config,
    lm_weights: str,
    dit_weights: str | None,
    sessions: int,
    card_bytes: int,
    positions: int,
    dtype: torch.dtype = torch.bfloat16,
) -> dict:
    """The plan of a random_weights shape (e.g. "full": the real model's shapes) on a card."""
    from kimiaudio.random_weights.config_files import GLM_DIR, write_config_files
    from kimiaudio.random_weights.shapes import shape_named

    with tempfile.TemporaryDirectory(prefix="kimiaudio-plan-") as tmp:
        root = Path(tmp)
        write_config_files(root, shape_named(shape))
        paths = CheckpointPaths(root=root, glm_tokenizer=root / GLM_DIR, text_only=dit_weights is None)
        stack = meta_stack(paths, dtype, config.detok, lm_weights, dit_weights, sessions)
    return memory_budget(stack, sessions, card_bytes, positions=positions)


def choose_weights(lm: str, dit: str, fp8: bool, plan_of) -> tuple[str, str, dict]:
    """Resolve auto in (lm, dit): the first of bf16, fp8 (when `fp8`), int8 whose plan fits
    (the last one tried if none does). plan_of(lm, dit) -> a plan with `fits`."""
    for choice in ["bf16", *(["fp8"] if fp8 else []), "int8"]:
        picked = tuple(choice if w == "auto" else w for w in (lm, dit))
        plan = plan_of(*picked)
        if plan["fits"] or "auto" not in (lm, dit):
            break
    return picked[0], picked[1], plan


def resolve_weights(
    config, paths: CheckpointPaths, device: torch.device, dtype: torch.dtype, text_only: bool
) -> tuple[str, str]:
    """([model] weights, [detok] weights) with auto resolved: on the CPU the configured dtype
    unquantized; on CUDA bf16 where the plan for server.max_sessions sessions of
    engine.max_model_len positions fits the card, else fp8 where the GPU has it, else int8.
    fp8 on a device without it is a ConfigError. The choice and its plan are logged."""
    lm, dit = config.model.weights, config.detok.weights
    plan = None
    if "auto" in (lm, dit):
        if device.type != "cuda":
            lm, dit = (("bf16" if w == "auto" else w) for w in (lm, dit))
        else:
            card = capacity_bytes(device)  # the card, or this process's cap on it
            sessions, positions = config.server.max_sessions, config.engine.max_model_len

            def plan_of(lm_weights, dit_weights):
                stack = meta_stack(paths, dtype, config.detok, lm_weights, None if text_only else dit_weights, sessions)
                return memory_budget(stack, sessions, card, positions=positions)

            lm, dit, plan = choose_weights(lm, dit, fp8_supported(device), plan_of)
    for key, value in (("model.weights", lm), ("detok.weights", None if text_only else dit)):
        if value == "fp8":
            require_fp8(device, key)
    if plan is not None:
        log.info(
            "weights = auto: LM %s, DiT %s (%s)\n%s",
            lm,
            dit,
            "fits" if plan["fits"] else "no choice fits; the smallest is used",
            format_memory_budget(plan),
        )
    else:
        log.info("weights: LM %s, DiT %s", lm, "none (text only)" if text_only else dit)
    return lm, dit


def format_memory_budget(plan: dict) -> str:
    """The plan as lines a reviewer can check against the card (GiB, and tokens for the pool)."""
    choice = ", ".join(f"{k} {v}" for k, v in plan.get("weights_choice", {}).items())
    lines = [f"memory plan for {plan['sessions']} sessions (weights: {choice}):"]
    for name, size in plan["weights"].items():
        lines.append(f"  weights {name:<16} {size / GIB:8.2f} GiB")
    lines.append(f"  weights total           {plan['weights_total_bytes'] / GIB:8.2f} GiB")
    if "detok_state_per_session" in plan:
        lines.append(f"  detok static buffers    {plan['detok_static_buffers'] / GIB:8.2f} GiB")
        lines.append(f"  detok graph pool        {plan['detok_graph_pool'] / GIB:8.2f} GiB")
        lines.append(
            f"  detok state             {plan['detok_state_all_sessions'] / GIB:8.2f} GiB "
            f"({plan['detok_state_per_session'] / (1 << 20):.1f} MiB a session at the K/V cap)"
        )
    lines.append(f"  fixed total             {plan['fixed_total'] / GIB:8.2f} GiB")
    if "kv_pool" in plan:
        lines.append(f"  headroom                {plan['headroom'] / GIB:8.2f} GiB")
        lines.append(
            f"  LM KV pool (sized last) {plan['kv_pool'] / GIB:8.2f} GiB = {plan['kv_pool_tokens']:,} tokens "
            f"({plan['lm_kv_per_token'] / 1024:.0f} KiB a token) of {plan['device_total'] / GIB:.1f} GiB, "
            f"{plan['tokens_per_session']:,} a session"
        )
    if "fits" in plan:
        need = plan["sessions"] * plan["positions_per_session"]
        lines.append(
            f"  {'fits' if plan['fits'] else 'does NOT fit'}: {plan['sessions']} sessions x "
            f"{plan['positions_per_session']:,} positions = {need:,} tokens"
        )
    return "\n".join(lines)
