"""`weights = auto` resolved before loading, from the memory plan of the card; and the plan's
one-line refusal of a card too small, before 20 GB of weights are read onto it."""

from __future__ import annotations

import logging

import torch

from kimiaudio.checkpoint.paths import CheckpointPaths
from kimiaudio.layers.device_memory import GIB, capacity_bytes
from kimiaudio.layers.fp8 import fp8_supported, require_fp8
from kimiaudio.pipeline.memory_plan import check_plan, plan_memory
from kimiaudio.pipeline.meta_stack import meta_stack

log = logging.getLogger(__name__)


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
    On CUDA the chosen plan is checked (check_plan: a card too small is a ConfigError now,
    before anything loads) and summed up in the log (the pipeline logs it whole); fp8 on a
    device without it is a ConfigError."""
    lm, dit = config.model.weights, config.detok.weights
    plan = None
    if device.type != "cuda":
        lm, dit = (("bf16" if w == "auto" else w) for w in (lm, dit))
    else:
        card = capacity_bytes(device)  # the card, or this process's cap on it

        def plan_of(lm_weights, dit_weights):
            stack = meta_stack(paths, dtype, config, lm_weights, None if text_only else dit_weights)
            return plan_memory(stack, config, card, on_gpu=True)

        lm, dit, plan = choose_weights(lm, dit, fp8_supported(device), plan_of)
    for key, value in (("model.weights", lm), ("detok.weights", None if text_only else dit)):
        if value == "fp8":
            require_fp8(device, key)
    if plan is not None:
        check_plan(plan, str(device))  # refuses a card too small; the pipeline warns of a short pool
        auto = "auto" in (config.model.weights, config.detok.weights)
        log.info(
            "weights: LM %s, DiT %s%s; on %s (%.2f GiB) the plan leaves %s KV tokens for %d sessions (%s)",
            lm,
            "none (text only)" if text_only else dit,
            (" (auto: the first that fits)" if plan["fits"] else " (auto: none fits, the smallest)") if auto else "",
            device,
            plan["device_total"] / GIB,
            f"{plan['kv_pool_tokens']:,}",
            plan["sessions"],
            "fits" if plan["fits"] else "does not fit",
        )
    else:
        log.info("weights: LM %s, DiT %s", lm, "none (text only)" if text_only else dit)
    return lm, dit
