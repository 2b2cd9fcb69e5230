"""The memory plan (memory_plan.py) as lines a reviewer checks against the card: GiB per part
and where each figure comes from (counted, configured, or estimated: memory_estimates.py)."""

from __future__ import annotations

from kimiaudio.layers.device_memory import GIB

_LABELS = {
    "weights": "weights total",
    "detok_static_buffers": "detok static buffers",
    "detok_graph_pool": "detok graph pool",
    "detok_activations": "detok activations",
    "detok_state": "detok state",
    "voice_cache": "voice cache",
    "lm_graph_pool": "LM graph pool",
    "lm_mixed_graph_pool": "LM mixed-step graphs",
    "activations": "activations",
    "cuda_context": "CUDA context",
    "allocator_slack": "allocator slack",
}


def format_memory_plan(plan: dict) -> str:
    choice = ", ".join(f"{k} {v}" for k, v in plan.get("weights_choice", {}).items())
    total = plan["device_total"]
    on = f"a {total / GIB:.2f} GiB {'GPU' if plan['on_gpu'] else 'device'}" if total is not None else "the CPU"
    sessions = f"{plan['sessions']} session{'s' if plan['sessions'] != 1 else ''}"
    lines = [f"memory plan for {sessions} on {on} (weights: {choice}):"]
    for name, size in plan["weights"].items():
        lines.append(f"  weights {name:<19} {size / GIB:8.2f} GiB")
    for name, size in plan["reserved"].items():
        kind = plan["sources"][name].split(":")[0]
        note = ""
        if name == "detok_static_buffers":
            note = f" (batches of at most {plan['detok_batch_rows']} rows)"
        elif name == "detok_state":
            note = f" ({plan['detok_state_per_session'] / (1 << 20):.1f} MiB a session at the K/V cap)"
        lines.append(f"  {_LABELS.get(name, name):<27} {size / GIB:8.2f} GiB  {kind}{note}")
    lines.append(f"  {'reserved total':<27} {plan['reserved_total'] / GIB:8.2f} GiB")
    lines.append(
        f"  LM KV pool ({plan['kv_pool_source']}): {plan['kv_pool'] / GIB:.2f} GiB = {plan['kv_pool_tokens']:,} tokens "
        f"({plan['lm_kv_per_token'] / 1024:.0f} KiB a token), {plan['tokens_per_session']:,} a session"
    )
    left = plan["left_unused"]
    if left is not None and left >= plan["kv_block_bytes"]:
        lines.append(f"  left unused (more than the pool can use) {left / GIB:.2f} GiB")
    elif left is not None and left < 0:
        lines.append(f"  short: the reserved parts exceed the device by {-left / GIB:.2f} GiB")
    need = plan["sessions"] * plan["positions_per_session"]
    lines.append(
        f"  {'fits' if plan['fits'] else 'does NOT fit'}: {sessions} x "
        f"{plan['positions_per_session']:,} positions = {need:,} tokens"
    )
    lines.append("  (estimated parts: pipeline/memory_estimates.py, measured by bench --memory-estimates)")
    return "\n".join(lines)
