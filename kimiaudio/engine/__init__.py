"""Continuous-batching serving engine: paged KV cache, prefix cache, chunked prefill.

Bookkeeping (request, step_output, sequence, block_manager, scheduler, step_plan, stop_rules)
imports no torch; the model runner, the paged attention backends and their kernels, the static
batches, the engine and the reference loop do.
"""
