"""The device memory plan of a loaded stack: what is fixed, what grows per session, and what
is left for the LM's KV pool, which is sized last.

Fixed: every component's weights, the detokenizer's static batch buffers and CUDA graph pool
(known once prepare_for_serving ran). Per session: the detokenizer's prefix K/V at its cap
(max_kv_cache_frames) plus the vocoder overlap it holds; per LM token, its K/V in every trunk
and MIMO layer. The KV pool gets what is left of the card after those and a headroom.
"""

from __future__ import annotations

GIB = 1 << 30


def _bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))


def memory_budget(stack, sessions: int, device_bytes: int | None = None, graphs: dict | None = None,
                  headroom_bytes: int = 4 * GIB) -> dict:
    """Bytes by item for `sessions` concurrent sessions. `device_bytes`: the card's total (None:
    no KV pool line); `graphs`: Detokenizer.prepare_for_serving()'s report."""
    weights = {"lm": _bytes(stack.lm), "whisper": _bytes(stack.whisper.encoder),
               "glm4_tokenizer": _bytes(stack.glm4.model)}
    detok = stack.detokenizer
    plan: dict = {"weights": weights, "sessions": sessions}
    fixed = sum(weights.values())
    if detok is not None:
        weights.update(dit=_bytes(detok.dit), vocoder=_bytes(detok.vocoder))
        fixed += weights["dit"] + weights["vocoder"]
        graph_bytes = (graphs or {}).get("added_bytes", 0)
        plan.update(detok_static_buffers=detok.flow.arena.nbytes, detok_graph_pool=graph_bytes,
                    detok_state_per_session=detok.state_bytes_per_stream(),
                    detok_state_all_sessions=sessions * detok.state_bytes_per_stream())
        fixed += detok.flow.arena.nbytes + graph_bytes + plan["detok_state_all_sessions"]
    cfg = stack.lm.config
    element = next(stack.lm.parameters()).element_size()
    plan["lm_kv_per_token"] = cfg.num_kv_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * element
    plan["fixed_total"] = fixed
    if device_bytes is not None:
        plan.update(device_total=device_bytes, headroom=headroom_bytes,
                    kv_pool=max(0, device_bytes - fixed - headroom_bytes))
        plan["kv_pool_tokens"] = plan["kv_pool"] // plan["lm_kv_per_token"]
    return plan


def format_memory_budget(plan: dict) -> str:
    """The plan as lines a reviewer can check against the card (GiB, and tokens for the pool)."""
    lines = [f"memory plan for {plan['sessions']} sessions:"]
    for name, size in plan["weights"].items():
        lines.append(f"  weights {name:<16} {size / GIB:8.2f} GiB")
    if "detok_state_per_session" in plan:
        lines.append(f"  detok static buffers    {plan['detok_static_buffers'] / GIB:8.2f} GiB")
        lines.append(f"  detok graph pool        {plan['detok_graph_pool'] / GIB:8.2f} GiB")
        lines.append(f"  detok state             {plan['detok_state_all_sessions'] / GIB:8.2f} GiB "
                     f"({plan['detok_state_per_session'] / (1 << 20):.1f} MiB a session at the K/V cap)")
    lines.append(f"  fixed total             {plan['fixed_total'] / GIB:8.2f} GiB")
    if "kv_pool" in plan:
        lines.append(f"  headroom                {plan['headroom'] / GIB:8.2f} GiB")
        lines.append(f"  LM KV pool (sized last) {plan['kv_pool'] / GIB:8.2f} GiB = {plan['kv_pool_tokens']:,} tokens "
                     f"({plan['lm_kv_per_token'] / 1024:.0f} KiB a token) of {plan['device_total'] / GIB:.1f} GiB")
    return "\n".join(lines)
