"""A session's write to the conversation store that failed, as the server log tells it: a lost
database (StoreUnavailableError: the session talks on, and the client gets a `storage_failed`
error) is one warning line; anything else is a bug, logged with its traceback."""

from __future__ import annotations

import logging

from kimiaudio.errors import StoreUnavailableError


def log_store_failure(log: logging.Logger, session_id: str, what: str, exc: BaseException) -> None:
    """`what`: the write, as the log line names it ("storing the assistant turn")."""
    if isinstance(exc, StoreUnavailableError):
        log.warning("session %s: %s failed: %s", session_id, what, exc)
    else:
        log.error("session %s: %s failed", session_id, what, exc_info=exc)
