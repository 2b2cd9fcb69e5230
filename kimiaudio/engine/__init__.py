"""Continuous-batching serving engine: paged KV cache, prefix cache, chunked prefill.

Bookkeeping (sequence, block_manager, scheduler) imports no torch; the model runner, the
paged attention backend and the engines do. The torch side is imported lazily here, so
importing the bookkeeping modules never pulls in torch.
"""

from kimiaudio.engine.request import EngineRequest, RequestError, StepOutput

__all__ = ["AsyncEngine", "EngineRequest", "EngineStats", "LLMEngine", "RequestError", "RequestHandle", "StepOutput"]


def __getattr__(name: str):
    if name in ("LLMEngine", "EngineStats"):
        from kimiaudio.engine import llm_engine

        return getattr(llm_engine, name)
    if name in ("AsyncEngine", "RequestHandle"):
        from kimiaudio.engine import async_engine

        return getattr(async_engine, name)
    raise AttributeError(f"module 'kimiaudio.engine' has no attribute {name!r}")
