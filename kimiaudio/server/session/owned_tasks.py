"""The background tasks one session (or the peer carrying it) owns.

Each task started with `spawn` is kept until it ends, so closing can cancel what still runs
and wait for it (`stop`: over before the close returns, so the app may stop the VAD thread and
the store next); a task's failure is logged once, naming the owner and what the task was
(`quiet` exceptions, such as a client hanging up, at INFO: they are how sessions end). From
the moment the owner begins to close, `closing` is True: its parts start no new work then (a
response or a transcription begun for a client that is gone would only cost the pipeline).
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 2.0  # a cancelled task has this long to finish


class OwnedTasks:
    def __init__(self, owner: str, quiet: tuple[type[BaseException], ...] = ()):
        self.owner, self.quiet = owner, quiet
        self._tasks: set[asyncio.Task] = set()
        self.closing = False  # the owner is closing: nothing new is started

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro, what: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)

        def finished(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            exc = None if t.cancelled() else t.exception()
            if isinstance(exc, self.quiet):
                log.info("%s: %s ended: the client went away (%s)", self.owner, what, type(exc).__name__)
            elif exc is not None:
                log.error("%s: %s failed", self.owner, what, exc_info=exc)

        task.add_done_callback(finished)
        return task

    async def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Cancel every task but the caller's own and wait (up to `timeout`) for them to end."""
        current = asyncio.current_task()
        tasks = [task for task in self._tasks if task is not current]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
