"""Waiting on a condition instead of on the wall clock."""

from __future__ import annotations

import asyncio


async def eventually(check, what: str, timeout: float = 120.0, interval: float = 0.05):
    """Await `check()` until it returns something truthy, and return that; an AssertionError
    naming `what` after `timeout` s. The limit catches a hang, not slowness: on a loaded 2-core
    machine what takes a tenth of a second alone can take many seconds."""
    try:
        async with asyncio.timeout(timeout):
            while not (result := await check()):
                await asyncio.sleep(interval)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {timeout:.0f} s") from None
    return result
