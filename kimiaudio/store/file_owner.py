"""One process owns a SQLite conversation file: a second `serve` on the same file is refused.

The file's store drops every lease when it opens (an earlier owner was killed: its leases are
void), so a second process on the same file would take the live sessions' conversations from
the first, and both would write into one conversation. An exclusive advisory lock on a file
beside the database (`<database>.owner`, which holds the owner's pid) marks the owner; the
kernel releases it when the process ends, however it ends. Several instances share
conversations through PostgreSQL instead ([storage] url). Where the platform has no flock
(Windows), nothing is locked.
"""

from __future__ import annotations

import os
from pathlib import Path

from kimiaudio.errors import KimiAudioError

try:
    import fcntl
except ImportError:  # (Windows)
    fcntl = None  # type: ignore[assignment]


class FileOwner:
    def __init__(self, database: Path):
        self.database = database
        self.path = database.with_name(database.name + ".owner")
        self._fd: int | None = None

    def acquire(self) -> None:
        """Own the database now, or KimiAudioError (one line) naming the process that does."""
        if fcntl is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise KimiAudioError(f"{self.database}: cannot open the conversation database ({exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise KimiAudioError(
                f"{self.database}: in use by another kimiaudio process (pid {owner}); give this "
                "one its own data directory (--data-dir), or share conversations through PostgreSQL "
                "([storage] url)"
            ) from None
        try:  # (a full disk, a quota, a file size limit)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as exc:
            os.close(fd)  # (the lock goes with it)
            raise KimiAudioError(f"{self.database}: cannot write {self.path.name} beside it ({exc})") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # (the lock goes with it)
            self._fd = None
