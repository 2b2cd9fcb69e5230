"""The lease book: the conversation leases this instance's sessions hold, kept renewed.

A ConversationStore has one (`store.leases`). It takes and releases the leases' rows (leases.py)
on the store's writer thread, remembers which (conversation, session) pairs it holds and whom to
tell when one is taken over, and renews them every third of the store's `lease_seconds` (the
heartbeat, from the store's open() to its close()). Writes into a conversation's turns on a
session's behalf go through `write_turns`, which refuses them once the lease is no longer the
session's. The store's `instance_id`, `clock` and `lease_seconds` are read at each use.

A session of this instance that is closing (its client gone, what was heard of its answer still
being stored) is marked so (`closing`): another session opening the same conversation, or a
delete of it, then waits for that release, up to CLOSING_WAIT_S, instead of being refused while
the old one finishes (a client reconnecting at once, as the OpenAI clients and the page do, or
a user deleting the conversation just hung up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

from kimiaudio.errors import KimiAudioError
from kimiaudio.store.leases import (
    ConversationBusyError,
    ConversationLostError,
    acquire_row,
    as_holder,
    release_instance,
    release_row,
    renew,
)

log = logging.getLogger(__name__)

# How long an acquire waits for a closing session of this instance to let the conversation go:
# its close settles the answer in progress (the pipeline's grace to report its end) and stores
# what was heard. Longer, and the caller gets conversation_busy as before.
CLOSING_WAIT_S = 5.0


class LeaseStore(Protocol):
    """What the book needs of its store (ConversationStore)."""

    instance_id: str
    lease_seconds: float
    clock: Callable[[], float]

    async def write(self, fn: Callable, *args: Any) -> Any: ...


class LeaseBook:
    """The leases of one instance's sessions (see module docstring)."""

    def __init__(self, store: LeaseStore):
        self._store = store
        # (conversation, session) leases the heartbeat renews -> what to call if one is taken over
        self._held: dict[tuple[str, str], Callable[[str], None] | None] = {}
        # (conversation, session) leases whose sessions are closing -> set once released
        self._closing: dict[tuple[str, str], asyncio.Event] = {}
        self._heartbeat: asyncio.Task | None = None
        self.closing_wait_s = CLOSING_WAIT_S

    async def acquire(
        self, conversation_id: str, session_id: str, on_lost: Callable[[str], None] | None = None
    ) -> None:
        """Hold the conversation for `session_id`; ConversationBusyError if another session does.
        `on_lost(conversation_id)` is called (once, on the event loop) if another session is
        found to have taken it over (lose)."""
        wait = await self._acquire_row(conversation_id, session_id)
        if wait is not None and await self.closed(conversation_id):
            wait = await self._acquire_row(conversation_id, session_id)
        if wait is not None:
            raise ConversationBusyError(conversation_id, max(1.0, wait))
        self._held[(conversation_id, session_id)] = on_lost

    async def _acquire_row(self, conversation_id: str, session_id: str) -> float | None:
        store = self._store
        now = store.clock()
        return await store.write(
            acquire_row, conversation_id, store.instance_id, session_id, now, now + store.lease_seconds
        )

    async def closed(self, conversation_id: str) -> bool:
        """Wait, up to `closing_wait_s`, for a closing session of this instance that holds the
        conversation to let it go; False if none does (nothing to wait for)."""
        released = [event for (held, _), event in self._closing.items() if held == conversation_id]
        if not released:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(released[0].wait(), self.closing_wait_s)
        return True

    def closing(self, conversation_id: str, session_id: str) -> None:
        """The session holding the conversation is closing: an acquire of it waits for the
        release (see module docstring)."""
        if (conversation_id, session_id) in self._held:
            self._closing.setdefault((conversation_id, session_id), asyncio.Event())

    def _let_go(self, key: tuple[str, str]) -> None:
        """The lease is no longer the session's: whoever waits for it to close tries now."""
        event = self._closing.pop(key, None)
        if event is not None:
            event.set()

    def lose(self, conversation_id: str, session_id: str) -> None:
        """The lease is no longer the session's (a renewal or a write found it taken over):
        renewed no more, and its holder is told."""
        key = (conversation_id, session_id)
        self._let_go(key)
        if key in self._held:
            on_lost = self._held.pop(key)
            if on_lost is not None:
                on_lost(conversation_id)

    async def release(self, conversation_id: str, session_id: str) -> None:
        self._held.pop((conversation_id, session_id), None)  # renewed no more, even if the delete fails
        try:
            await self._store.write(release_row, conversation_id, self._store.instance_id, session_id)
        finally:
            self._let_go((conversation_id, session_id))

    def held(self) -> list[tuple[str, str]]:
        """(conversation, session) of the leases this instance's sessions hold."""
        return list(self._held)

    async def write_turns(self, conversation_id: str, holder: str | None, fn: Callable, *args: Any) -> Any:
        """Run `fn(sql, conversation_id, *args)`, a write into the conversation's turns, on the
        writer thread; with `holder`, only while that session of this instance holds the
        conversation's lease (else ConversationLostError, and the lease is lost: lose)."""
        if holder is None:
            return await self._store.write(fn, conversation_id, *args)
        try:
            return await self._store.write(
                as_holder, conversation_id, self._store.instance_id, holder, fn, conversation_id, *args
            )
        except ConversationLostError:
            self.lose(conversation_id, holder)
            raise

    def start(self) -> None:
        """Start the heartbeat (on the running event loop)."""
        self._heartbeat = asyncio.get_running_loop().create_task(self._renew_every(self._store.lease_seconds / 3))

    async def close(self) -> None:
        """Stop the heartbeat and release every lease of this instance."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        with contextlib.suppress(KimiAudioError):  # a database gone (or never opened): its leases expire by themselves
            await self._store.write(release_instance, self._store.instance_id)

    async def _renew_every(self, interval_s: float) -> None:
        """Renew the held leases every `interval_s` until cancelled (a failure is logged once
        and retried: the database may come back before the leases expire); the holders of
        those found taken over are told (lose)."""
        failing = False
        while True:
            await asyncio.sleep(interval_s)
            try:
                held = self.held()
                if held:
                    store = self._store
                    lost = await store.write(renew, store.instance_id, held, store.clock() + store.lease_seconds)
                    for conversation_id, session_id in lost:
                        log.warning(
                            "session %s: conversation %s was taken by another session", session_id, conversation_id
                        )
                        self.lose(conversation_id, session_id)
                if failing:
                    log.info("conversation leases renewed again")
                failing = False
            except Exception as exc:  # StoreUnavailableError, or a locked SQLite file
                if not failing:
                    log.warning("cannot renew the conversation leases: %s", exc)
                failing = True
