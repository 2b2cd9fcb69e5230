"""The device memory plan: every part reserved on the device, and the LM's KV pool, which gets
exactly what is left.

`plan_memory` is the one function that plans, with the same inputs wherever a plan is made: a
stack's modules (loaded, or built on the meta device from a checkpoint's config files:
meta_stack.py), the config (server.max_sessions, [engine], [detok], [voices], [audio]), the
device's capacity (the card, or this process's cap on it) and whether it is a GPU.
`bench --memory-plan` prints it before anything is loaded, `weights = auto` chooses from it
(weights_choice.py), and the pipeline sizes its KV pool from it (`plan_stack`,
`kv_blocks_on_device`) and logs it. The reserved parts:

- weights: every parameter and buffer of each component, counted;
- detok_static_buffers: the served buckets' buffers (at most server.max_sessions rows), counted;
- detok_state: one session's prefix K/V at its cap and vocoder overlap, x server.max_sessions;
- voice_cache: [voices] cache_mib;
- detok_graph_pool (detok_activations without graphs), lm_graph_pool and
  lm_mixed_graph_pool (the decode and mixed-step graphs), activations, and on a GPU
  cuda_context and allocator_slack: estimated from counted bases (memory_estimates.py).

The KV pool gets the rest in whole blocks (its scratch block included), at most what
max_num_seqs sequences of max_model_len positions can use; engine.num_kv_blocks fixes it
instead. Without a capacity (the CPU) it gets CPU_KV_BUDGET. The plan fits when the pool holds
`positions` tokens for each of server.max_sessions sessions; a pool that cannot hold one
sequence of engine.max_model_len is refused in one line (`check_plan`).
"""

from __future__ import annotations

import gc
import logging
import math

import torch

from kimiaudio.engine.kv_pool import KVPool, max_useful_blocks
from kimiaudio.engine.model_runner import graph_shapes
from kimiaudio.errors import ConfigError
from kimiaudio.layers.device_memory import GIB, capacity_bytes, free_bytes, host_available_bytes
from kimiaudio.pipeline.memory_estimates import ESTIMATES, estimate

log = logging.getLogger(__name__)

MIB = 1 << 20
CPU_KV_BUDGET = 2 * GIB  # the KV pool on the CPU, where no card bounds it
WINDOW_SECONDS = 30  # both speech encoders take 30 s windows, a batch of them at once
# Reserved parts allocated only after the KV pool is sized (or while serving): the pool must
# leave room for them in what the device has free when it is allocated.
AFTER_THE_POOL = (
    "detok_state",
    "voice_cache",
    "lm_graph_pool",
    "lm_mixed_graph_pool",
    "activations",
    "detok_activations",
    "allocator_slack",
)


def _bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))


def lm_tensor_bytes(lm, tokens: int) -> int:
    """Tensors alive at once while `tokens` positions go through one LM layer: the residual
    stream in and out, then q/k/v and the attention's output beside the normed input, or
    gate/up and their product (the normed input freed)."""
    cfg = lm.config
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    return tokens * (2 * cfg.hidden_size + max(qkv + cfg.hidden_size, 3 * cfg.intermediate_size)) * lm.dtype.itemsize


def _encoder_bytes(module, max_batch_segments: int, config, mask: bool) -> int:
    """One speech encoder's largest batch through one layer: its windows (audio.encode_batch_size
    utterances of audio.max_input_seconds, at most the encoder's max_batch_segments) x the
    residual beside q/k/v and the attention output, or beside its MLP's two hidden tensors; the
    GLM encoder adds its [B, 1, T, T] additive mask."""
    cfg = module.config
    d_model, positions = cfg.d_model, cfg.max_source_positions
    ffn = getattr(cfg, "encoder_ffn_dim", None) or cfg.ffn_dim  # transformers' name, or WhisperVQConfig's
    windows = config.audio.encode_batch_size * math.ceil(config.audio.max_input_seconds / WINDOW_SECONDS)
    width = d_model + max(4 * d_model, 2 * ffn) + (positions if mask else 0)
    return min(windows, max_batch_segments) * positions * width * next(module.parameters()).element_size()


def activation_bytes(stack, config) -> int:
    """Tensors alive at once in the largest eager forward: an LM prefill of
    engine.max_num_batched_tokens positions, or the speech encoders' largest batch. The
    encoders run on the LM worker between its steps, so the largest counts, not their sum."""
    whisper, glm = stack.whisper, stack.glm4
    return max(
        lm_tensor_bytes(stack.lm, config.engine.max_num_batched_tokens),
        _encoder_bytes(whisper.encoder, whisper.max_batch_segments, config, mask=False),
        _encoder_bytes(glm.model, glm.max_batch_segments, config, mask=True),
    )


def graph_logits_bytes(stack, config) -> int:
    """The logits every captured decode graph keeps (both heads, each padded batch size)."""
    sizes = graph_shapes(config.engine)[1]
    return sum(sizes) * 2 * stack.lm.config.vocab_size * stack.lm.dtype.itemsize


def mixed_graph_bytes(stack, config) -> int:
    """What the mixed-step graphs keep, counted: each token bucket's logits (a row for each of
    the static batch's sequences, both heads) and the largest bucket's live tensors."""
    rows, _, buckets = graph_shapes(config.engine)
    logits = len(buckets) * rows * 2 * stack.lm.config.vocab_size * stack.lm.dtype.itemsize
    return logits + lm_tensor_bytes(stack.lm, buckets[-1])


def component_weights(stack) -> dict[str, int]:
    """Bytes of every component's parameters and buffers, by component."""
    weights = {
        "lm": _bytes(stack.lm),
        "whisper": _bytes(stack.whisper.encoder),
        "glm4_tokenizer": _bytes(stack.glm4.model),
    }
    if stack.detokenizer is not None:
        weights.update(dit=_bytes(stack.detokenizer.dit), vocoder=_bytes(stack.detokenizer.vocoder))
    return weights


def reserved_parts(stack, config, on_gpu: bool) -> dict[str, tuple[int, str]]:
    """Every part reserved beside the KV pool: name -> (bytes, where the figure comes from)."""
    parts = {"weights": (sum(component_weights(stack).values()), "counted")}
    detok = stack.detokenizer
    if detok is not None:
        buffers = detok.flow.arena.nbytes
        parts["detok_static_buffers"] = (buffers, "counted")
        parts["detok_state"] = (config.server.max_sessions * detok.state_bytes_per_stream(), "counted")
        parts["voice_cache"] = (config.voices.cache_mib * MIB, "configured")
        # Graphed, the detokenizer's activations live in its graphs' pool; eager, they come and go.
        workspace = "detok_graph_pool" if on_gpu and config.detok.cuda_graphs else "detok_activations"
        parts[workspace] = _estimated("detok_graph_pool", buffers)
    if on_gpu and config.engine.cuda_graphs:
        parts["lm_graph_pool"] = _estimated("lm_graph_pool", graph_logits_bytes(stack, config))
        if config.engine.mixed_cuda_graphs:
            parts["lm_mixed_graph_pool"] = _estimated("lm_mixed_graph_pool", mixed_graph_bytes(stack, config))
    parts["activations"] = _estimated("activations", activation_bytes(stack, config))
    if on_gpu:
        parts["cuda_context"] = _estimated("cuda_context", 1)
        parts["allocator_slack"] = _estimated("allocator_slack", 1)
    return parts


def plan_memory(stack, config, device_bytes: int | None, on_gpu: bool, positions: int | None = None) -> dict:
    """Bytes of every reserved part and the KV pool for serving `config` on a device of
    `device_bytes` (None: no capacity, the CPU budget); `on_gpu`: CUDA graphs, the CUDA
    context and the allocator's slack are planned. `positions`: each session's positions for
    `fits` (default engine.max_model_len)."""
    sessions = config.server.max_sessions
    positions = config.engine.max_model_len if positions is None else positions
    parts = reserved_parts(stack, config, on_gpu)
    plan = {
        "device_total": device_bytes,
        "on_gpu": on_gpu,
        "sessions": sessions,
        "positions_per_session": positions,
        "weights_choice": {"lm": getattr(stack.lm, "weights", "bf16")},
        "weights": component_weights(stack),
        "reserved": {name: size for name, (size, _) in parts.items()},
        "sources": {name: source for name, (_, source) in parts.items()},
        "reserved_total": sum(size for size, _ in parts.values()),
    }
    detok = stack.detokenizer
    if detok is not None:
        plan["weights_choice"]["dit"] = getattr(detok.dit, "weights", "bf16")
        plan.update(
            detok_batch_rows=detok.buckets.batch_sizes[-1], detok_state_per_session=detok.state_bytes_per_stream()
        )
    plan.update(_kv_pool(stack, config, device_bytes, plan["reserved_total"]))
    plan["tokens_per_session"] = plan["kv_pool_tokens"] // max(1, sessions)
    plan["fits"] = plan["kv_pool_tokens"] >= sessions * positions
    return plan


def _estimated(name: str, base: int) -> tuple[int, str]:
    """(the estimate of `name` for its counted base, its source line)."""
    e = ESTIMATES[name]
    source = f"estimated: {e.measured:g} x (1 + {e.margin:g}) per {e.per} ({e.source})"
    return int(estimate(name) * base), source


def size(nbytes: int) -> str:
    """GiB, or MiB below a tenth of one (a tiny checkpoint's parts)."""
    return f"{nbytes / GIB:.2f} GiB" if abs(nbytes) >= GIB / 10 else f"{nbytes / MIB:.1f} MiB"


def _kv_pool(stack, config, device_bytes: int | None, reserved_total: int) -> dict:
    cfg, engine = stack.lm.config, config.engine
    per_token = KVPool.bytes_per_block(cfg.num_kv_layers, 1, cfg.num_key_value_heads, cfg.head_dim, stack.lm.dtype)
    per_block = per_token * engine.block_size
    left = CPU_KV_BUDGET if device_bytes is None else max(0, device_bytes - reserved_total)
    if engine.num_kv_blocks > 0:
        blocks, source = engine.num_kv_blocks, "engine.num_kv_blocks"
    else:
        blocks = max(0, min(left // per_block - 1, max_useful_blocks(engine)))  # - the scratch block
        source = "what is left" if device_bytes is not None else "the CPU budget"
    pool = (blocks + 1) * per_block if blocks else 0
    return {
        "lm_kv_per_token": per_token,
        "kv_block_bytes": per_block,
        "kv_blocks": blocks,
        "kv_pool": pool,
        "kv_pool_source": source,
        "kv_pool_tokens": blocks * engine.block_size,
        "max_model_len": engine.max_model_len,
        "kv_blocks_one_sequence": -(-engine.max_model_len // engine.block_size),
        "left_unused": None if device_bytes is None else device_bytes - reserved_total - pool,
    }


def check_plan(plan: dict, where: str, host_available: int | None = None) -> str | None:
    """For a plan against a device's capacity: ConfigError (one line) when the KV pool sized
    from what is left cannot hold one sequence of engine.max_model_len, or a fixed
    engine.num_kv_blocks does not fit, saying what does not fit and by how much. Else a warning
    line when the pool is short of server.max_sessions x positions (sessions then share it),
    or None. With no device capacity (the CPU) only a fixed engine.num_kv_blocks is checked,
    against the memory the machine has available (`host_available`, default: the kernel's
    MemAvailable)."""
    total = plan["device_total"]
    if total is None:
        if plan["kv_pool_source"] == "engine.num_kv_blocks":
            available = host_available_bytes() if host_available is None else host_available
            if available is not None and plan["kv_pool"] > available:
                raise ConfigError(
                    f"{where}: engine.num_kv_blocks = {plan['kv_blocks']:,} ({size(plan['kv_pool'])}) does not fit "
                    f"in the {size(available)} this machine has available; lower it, or set 0 for the CPU's "
                    f"pool of {size(CPU_KV_BUDGET)}"
                )
        return None
    room = max(0, total - plan["reserved_total"])
    what = None
    if plan["kv_pool_source"] == "engine.num_kv_blocks" and plan["left_unused"] < 0:
        what, short = (
            f"engine.num_kv_blocks = {plan['kv_blocks']:,} ({plan['kv_pool'] / GIB:.2f} GiB)",
            -plan["left_unused"],
        )
    elif plan["kv_pool_source"] == "what is left" and plan["kv_blocks"] < plan["kv_blocks_one_sequence"]:
        one = (plan["kv_blocks_one_sequence"] + 1) * plan["kv_block_bytes"]
        what = f"a KV pool for one sequence of engine.max_model_len = {plan['max_model_len']:,} ({size(one)})"
        short = one - room
    if what is not None:
        largest = sorted(plan["reserved"].items(), key=lambda kv: -kv[1])[:3]
        parts = ", ".join(f"{name} {size(part)}" for name, part in largest)
        raise ConfigError(
            f"{where} ({total / GIB:.2f} GiB): {what} does not fit by {size(short)}: the other parts "
            f"take {size(plan['reserved_total'])} (largest: {parts}) with server.max_sessions = "
            f"{plan['sessions']}. Use weights = fp8 or int8, or lower server.max_sessions or engine.max_model_len "
            f"(bench --memory-plan prints the plan)"
        )
    if plan["kv_pool_source"] == "what is left" and not plan["fits"]:
        return (
            f"{where}: the KV pool holds {plan['kv_pool_tokens']:,} tokens, {plan['tokens_per_session']:,} a session, "
            f"short of {plan['positions_per_session']:,} for each of server.max_sessions = {plan['sessions']}: "
            f"sessions share it (a long conversation may wait for room)"
        )
    return None


def plan_stack(stack, config, device_bytes: int | None = None) -> dict:
    """The plan of a loaded stack as served with `config`: on CUDA against the card's capacity
    (or this process's cap); on the CPU against `device_bytes` if given, else the CPU budget."""
    on_gpu = stack.device.type == "cuda"
    if on_gpu and device_bytes is None:
        device_bytes = capacity_bytes(stack.device)
    return plan_memory(stack, config, device_bytes, on_gpu)


def kv_blocks_on_device(plan: dict, device: torch.device) -> int:
    """The plan's KV blocks, allocated now. On CUDA the parts allocated so far (weights,
    detokenizer buffers and graphs) are what the plan says only if its estimates hold and no
    earlier pool is still alive: what the device has free, less the parts still to come, bounds
    the pool, with a warning naming the difference when it is smaller than planned."""
    planned = plan["kv_blocks"]
    if device.type != "cuda" or planned == 0 or plan["kv_pool_source"] != "what is left":
        return planned  # the CPU's budget, or engine.num_kv_blocks as configured
    gc.collect()  # an earlier engine's pool, held only by a reference cycle, goes now
    torch.cuda.empty_cache()  # ... and what the allocator cached back to the device
    later = sum(size for name, size in plan["reserved"].items() if name in AFTER_THE_POOL)
    room = free_bytes(device) - later
    blocks = max(0, room // plan["kv_block_bytes"] - 1)
    if blocks < planned:
        allocated = torch.cuda.memory_allocated(device)
        log.warning(
            "memory plan: %s has room for %d KV blocks, not the %d planned (%.2f GiB less): it holds %.2f GiB "
            "already, the plan expected %.2f GiB by now (an estimate in pipeline/memory_estimates.py too "
            "low, or another pipeline or process holding memory)",
            device,
            blocks,
            planned,
            (planned - blocks) * plan["kv_block_bytes"] / GIB,
            allocated / GIB,
            sum(size for name, size in plan["reserved"].items() if name not in AFTER_THE_POOL + ("cuda_context",))
            / GIB,
        )
    return min(blocks, planned)
