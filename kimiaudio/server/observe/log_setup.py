"""Logging of the server process: levels, the libraries' chatter, and client faults.

`configure_logging(level)`: timestamped lines; aioice and aiortc at WARNING (aioice writes
about eight INFO lines per connection); and what a client's fault makes the libraries log as
an ERROR with a traceback becomes one INFO line: aiohttp's "Error handling request" for a
request that was never valid HTTP (garbage, an over-long header, a TLS hello on the plain
port), and asyncio's "Task exception was never retrieved" for a ConnectionError or a DTLS
session already shut (aiortc sends data-channel messages from tasks of its own, which fail
when the peer has just gone).
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

from kimiaudio.errors import KimiAudioError

QUIET_LIBRARIES = ("aioice", "aiortc")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class ClientFaultFilter(logging.Filter):
    """Rewrites a record whose exception is the client's doing into one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, (HttpProcessingError, ConnectionError)) or _is_dtls_shut(exc):
            what = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            first_line = record.getMessage().splitlines()[0]
            record.msg, record.args = "%s: %s", (first_line, " ".join(str(what).split())[:200])
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)  # --log-level WARNING hides it
        return True


def _is_dtls_shut(exc: BaseException | None) -> bool:
    """pyOpenSSL's 'protocol is shutdown': aiortc's SCTP transport sending on a DTLS session
    the peer has just closed (a hang-up during an answer), from a task nobody awaits."""
    return exc is not None and type(exc).__module__.startswith("OpenSSL") and "shutdown" in str(exc)


def configure_logging(level: str = "INFO") -> None:
    if level.upper() not in LEVELS:
        raise KimiAudioError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level.upper())
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
    filter_client_faults()


def filter_client_faults() -> None:
    """Install ClientFaultFilter (once) on the loggers where client faults show up. create_app
    calls it too, so an app embedded without the CLI's logging setup logs them the same way."""
    for name in ("aiohttp.server", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, ClientFaultFilter) for f in logger.filters):
            logger.addFilter(ClientFaultFilter())
