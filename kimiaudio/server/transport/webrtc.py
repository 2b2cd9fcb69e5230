"""WebRTC's parts for the routes and the app, or the name of the package that is missing.

WebRTC needs aiortc (and PyAV). A machine without their wheels (the GPU machine:
.ci/gpu-wheels) still serves: the app logs one warning at start (`warn_if_missing`), the
calls routes, the page's offer and a sideband connection to a call answer 503
webrtc_unavailable (`require`), and the Realtime WebSocket and the HTTP routes serve as always.
"""

from __future__ import annotations

import logging

from kimiaudio.server.api_error import ApiError

try:  # aiortc is imported by these modules' own imports
    from kimiaudio.server.transport.call_directory import call_directory, hang_up, open_call
    from kimiaudio.server.transport.rtc_peer import RtcOffer, find_call
    from kimiaudio.server.transport.sideband import Sideband
except ImportError as exc:
    MISSING: str | None = exc.name or "aiortc"
else:
    MISSING = None

__all__ = [
    "MISSING",
    "RtcOffer",
    "Sideband",
    "call_directory",
    "find_call",
    "hang_up",
    "open_call",
    "require",
    "warn_if_missing",
]

log = logging.getLogger(__name__)


def require() -> None:
    """ApiError 503 webrtc_unavailable when WebRTC cannot be served here."""
    if MISSING:
        raise ApiError(
            503,
            "webrtc_unavailable",
            f"WebRTC is not available on this server ({MISSING} is not installed); "
            "the Realtime WebSocket /v1/realtime is",
        )


def warn_if_missing() -> None:
    """One line at start when WebRTC can only answer 503."""
    if MISSING:
        log.warning(
            "WebRTC is off: %s is not installed (pip install aiortc av); /v1/realtime/calls and /api/rtc/offer "
            "answer 503, the Realtime WebSocket and the HTTP routes serve",
            MISSING,
        )
