"""Logging of the server process: levels, the libraries' chatter, and client faults.

`configure_logging(level)`: timestamped lines; aioice and aiortc at WARNING (aioice writes
about eight INFO lines per connection); and aiohttp's "Error handling request" for a request
that was never valid HTTP (garbage, an over-long header, a TLS hello on the plain port) or
whose client hung up becomes one INFO line without a traceback: a client's fault is not the
server's error.
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
        if isinstance(exc, (HttpProcessingError, ConnectionResetError)):
            what = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            record.msg, record.args = "%s: %s", (record.getMessage(), " ".join(str(what).split())[:200])
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
        return True


def configure_logging(level: str = "INFO") -> None:
    if level.upper() not in LEVELS:
        raise KimiAudioError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level.upper())
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, ClientFaultFilter) for f in server_log.filters):
        server_log.addFilter(ClientFaultFilter())
