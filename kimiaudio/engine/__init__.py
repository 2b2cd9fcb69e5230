"""Continuous-batching serving engine: paged KV cache, prefix cache, chunked prefill.

Bookkeeping (request, sequence, block_manager, scheduler, stop_rules) imports no torch; the
model runner, the paged attention backend, the engine and the reference loop do.
"""
