"""A session's write to the conversation store that failed, as the server log tells it: a lost
database (StoreUnavailableError: the session talks on, and the client gets a `storage_failed`
error) is one warning line; so is a write into a conversation another session took over
(ConversationLostError: the client was told of that once, `conversation_lost`, and gets no
`storage_failed` for each write refused); anything else is a bug, logged with its traceback."""

from __future__ import annotations

import logging

from kimiaudio.errors import StoreUnavailableError
from kimiaudio.store import ConversationLostError


def log_store_failure(log: logging.Logger, session_id: str, what: str, exc: BaseException) -> bool:
    """`what`: the write, as the log line names it ("storing the assistant turn") -> whether the
    client is to be told (`storage_failed`)."""
    if isinstance(exc, StoreUnavailableError | ConversationLostError):
        log.warning("session %s: %s failed: %s", session_id, what, exc)
    else:
        log.error("session %s: %s failed", session_id, what, exc_info=exc)
    return not isinstance(exc, ConversationLostError)
