"""The client's SDP offer, checked before aiortc's peer connection sees it.

aiortc parses whatever it is given and fails late: a malformed line is an AssertionError or a
ValueError from deep inside setRemoteDescription, and an offer without a DTLS fingerprint is
accepted and fails later, in the DTLS handshake. Here the offer is parsed once with aiortc's
own parser (any failure: one plain 400) and what a usable audio session needs is required up
front: an `m=audio` section that sends (the microphone), ICE credentials, RTCP mux, a DTLS
fingerprint of a known hash and an `a=mid` of its own for every section (a section cut short
has none of them), ports, candidates, RTP header extension ids and the data channels' SCTP
port and message size (16 KiB at least) in range, and a sane size. What aiortc still refuses later is a 400 too
(transport/rtc_peer.py).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from kimiaudio.server.api_error import ApiError

if TYPE_CHECKING:  # imported where an offer is parsed: a server without aiortc imports this module
    from aiortc.sdp import SessionDescription

log = logging.getLogger(__name__)

MAX_SDP_BYTES = 64 * 1024  # a browser's audio + data channel offer is 2-8 KB
MAX_MEDIA_SECTIONS = 8
_FINGERPRINT_HASHES = ("sha-1", "sha-224", "sha-256", "sha-384", "sha-512")
_FINGERPRINT_VALUE = re.compile(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){19,63}")


def _bad(message: str) -> ApiError:
    return ApiError(400, "bad_offer", message)


def check_offer(sdp: object) -> SessionDescription:
    """The parsed offer, or ApiError 400 bad_offer saying what is wrong."""
    from aiortc.sdp import SessionDescription

    if not isinstance(sdp, str) or not sdp.strip():
        raise _bad('expected {"sdp": "<SDP text>", "type": "offer"}')
    if len(sdp.encode("utf-8", "surrogatepass")) > MAX_SDP_BYTES:
        raise _bad(f"the SDP offer is too large (the limit is {MAX_SDP_BYTES} bytes)")
    if not sdp.lstrip().startswith("v=0"):
        raise _bad("the SDP offer must start with v=0")
    if any((ord(c) < 32 and c not in "\r\n\t") or ord(c) == 127 for c in sdp):
        raise _bad("the SDP offer has control characters")
    if sdp.count("\nm=") > MAX_MEDIA_SECTIONS:
        raise _bad(f"the SDP offer has more than {MAX_MEDIA_SECTIONS} media sections")
    try:
        parsed = SessionDescription.parse(sdp)
    except Exception as exc:  # aiortc's parser asserts and indexes its way through untrusted text
        log.info("unparsable SDP offer refused (%s: %s)", type(exc).__name__, exc)
        raise _bad("the SDP offer could not be parsed") from None
    audio = [media for media in parsed.media if media.kind == "audio"]
    if not audio:
        raise _bad("the offer has no audio track: send the microphone with the offer")
    if not any(media.direction in (None, "sendrecv", "sendonly") for media in audio):  # (no a=: sendrecv)
        raise _bad(
            f"the offer's audio is {audio[0].direction}: it sends no microphone (offer it sendrecv, with "
            "the microphone's track)"
        )
    for number, media in enumerate(parsed.media, 1):
        _check_media(media, f"media section {number} ({media.kind})")
    mids = [media.rtp.muxId for media in parsed.media]
    if len(set(mids)) != len(mids):
        raise _bad(f"the offer's media sections must each have an a=mid of its own (got {', '.join(mids)})")
    return parsed


def _check_media(media, where: str) -> None:
    if not 0 <= media.port <= 65535:
        raise _bad(f"{where}: port {media.port} is out of range")
    if not media.rtp.muxId:  # (aiortc pairs the answer's transports by it: without one, it fails half-built)
        raise _bad(f"{where}: a=mid is required")
    # A section that lost its attributes (a cut offer) has no ice / dtls object at all.
    if media.ice is None or not media.ice.usernameFragment or not media.ice.password:
        raise _bad(f"{where}: a=ice-ufrag and a=ice-pwd are required")
    if media.kind in ("audio", "video") and not media.rtcp_mux:
        raise _bad(f"{where}: a=rtcp-mux is required")
    if media.dtls is None or not media.dtls.fingerprints:
        raise _bad(f"{where}: a=fingerprint (the DTLS certificate's) is required")
    for fingerprint in media.dtls.fingerprints:
        known = fingerprint.algorithm.lower() in _FINGERPRINT_HASHES
        if not known or not _FINGERPRINT_VALUE.fullmatch(fingerprint.value):
            raise _bad(
                f"{where}: a=fingerprint must be one of {', '.join(_FINGERPRINT_HASHES)} "
                "followed by colon-separated hex bytes"
            )
    for extension in media.rtp.headerExtensions:  # (packed into every RTP packet sent: 1 to 255 fit)
        if not 1 <= extension.id <= 255:
            raise _bad(f"{where}: a=extmap id {extension.id} is out of range (1 to 255)")
    if media.kind == "application":
        _check_sctp(media, where)
    for candidate in media.ice_candidates:
        if not 0 <= candidate.port <= 65535 or not 0 <= candidate.priority < 2**32 or not 1 <= candidate.component <= 2:
            raise _bad(f"{where}: an a=candidate line has an out-of-range port, priority or component")


# The least a data channel must carry in one message: a session.created or response.done event
# runs to a few KiB (one larger than the peer takes is answered with an error event instead:
# transport/event_too_large.py).
MIN_MESSAGE_BYTES = 16384


def _check_sctp(media, where: str) -> None:
    """The data channels' SCTP port and message size, which aiortc packs and compares unchecked
    once the call is up (out of range: a traceback in the log and a channel that never opens)."""
    legacy = media.profile == "DTLS/SCTP"  # the old form, `m=application 9 DTLS/SCTP 5000`, names the port there
    port = media.fmt[0] if legacy else media.sctp_port
    if not (isinstance(port, int) or (isinstance(port, str) and port.isascii() and port.isdigit())):
        raise _bad(f"{where}: a=sctp-port (the data channels' SCTP port) is required")
    if not 1 <= int(port) <= 65535:
        raise _bad(f"{where}: SCTP port {port} is out of range (1 to 65535)")
    size = media.sctpCapabilities.maxMessageSize if media.sctpCapabilities is not None else 0
    if size < 0:
        raise _bad(f"{where}: a=max-message-size must be a number of bytes (0: no limit)")
    if 0 < size < MIN_MESSAGE_BYTES:  # (browsers take 256 KiB or more)
        raise _bad(
            f"{where}: a=max-message-size {size} is too small for the session's events "
            f"(at least {MIN_MESSAGE_BYTES} bytes, or 0: no limit)"
        )
