"""One WebRTC client: its peer connection, carrying a RealtimeSession (RtcPeer), and how a
client's SDP offer becomes one (`answer_offer`: POST /v1/realtime/calls, and its deprecated
alias /api/rtc/offer). Each peer has a call id (`rtc_...`), which names it to
/v1/realtime/calls/{call_id}/hangup.

Follows aiortc's examples/server: one RTCPeerConnection per client, every handler registered
before setRemoteDescription, no trickle ICE (aiortc's setLocalDescription returns once ICE
gathering is complete), closed when the connection fails or closes.

What it carries: the incoming audio track into its session (microphone_in.py); the events'
data channel's messages into `RealtimeSession.handle_message`, one after another in the order
they came (as a WebSocket's: an event whose handling waits, such as a commit waiting for the
VAD thread, is not overtaken by the response.create sent after it), and the session's events out
(queued until the channel opens), in the offer's event shape (GA over WebRTC unless the route says otherwise:
session/event_shape.py); the session's responses out through a PlaybackTrack (48 kHz, 20 ms
frames). The events' data channel is the first the client opens labelled `oai-events`
(OpenAI's label; the deprecated route takes `events` too: RtcOffer.channels); a channel
labelled otherwise is left unused (nothing read from it, nothing sent on it).

A client that vanishes is noticed by the connection state (ICE consent checks fail: about half a
minute), or by its audio never starting or stopping while the connection is down
(microphone_in.py). Closing cancels its turn and tasks, closes its sideband connections
(OpenAI's `GET /v1/realtime?call_id=`: sideband.py, which `watch` the call's events) and frees
its slot.

Data-channel messages go to `RealtimeSession.handle_message`, which checks them as JSON
(json_input.parse_json: size, depth, UTF-8, no NaN) and answers whatever fails with an `error`
event: a client's message never ends in a silent traceback.

`answer_offer(context, offer)` lets a client in, in this order: the conversation it continues
must exist (404 conversation_not_found), the offer must be usable (inputs/sdp_offer.py: 400
bad_offer), a session slot is reserved (503 when full), the peer
is built, the conversation is leased (409 conversation_busy if another session holds it), its
session settings applied in order (a call's defaults: the user's words transcribed if
`[server] transcribe_input`; then an ephemeral key's, then the call's own; 400 naming the
field), the offer answered (400 bad_offer if aiortc cannot use it); a failure at any step
closes what was built and frees the slot (session_registry.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Protocol

from aiortc import RTCConfiguration, RTCDataChannel, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.exceptions import InvalidStateError
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from kimiaudio.errors import KimiAudioError
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import ServerContext
from kimiaudio.server.inputs.sdp_offer import check_offer
from kimiaudio.server.session.event_shape import EventShape, event_shape
from kimiaudio.server.session.owned_tasks import OwnedTasks
from kimiaudio.server.session.realtime_session import RealtimeSession
from kimiaudio.server.session.session_update import SessionUpdate, Transcription
from kimiaudio.server.session_registry import Admitted, Transport
from kimiaudio.server.transport.audio_track import MeteredPlaybackTrack
from kimiaudio.server.transport.closes_once import ClosesOnce
from kimiaudio.server.transport.event_too_large import too_large_error
from kimiaudio.server.transport.ice_servers import ice_servers
from kimiaudio.server.transport.input_clock import InputClock
from kimiaudio.server.transport.microphone_in import read_microphone

log = logging.getLogger(__name__)

EVENTS_CHANNEL = "oai-events"  # the label of the events' data channel in OpenAI's protocol
MAX_OUTBOX = 1000  # events kept for a data channel that has not opened yet
# What a task of the session may die of when the client goes away: a hang-up, not a bug.
HANG_UPS = (ConnectionError, MediaStreamError, InvalidStateError)


class CallWatcher(Protocol):
    """A second connection to a call's session (sideband.py)."""

    def send(self, event: dict) -> None: ...

    async def close(self, reason: str, shutdown: bool = False) -> None: ...


class RtcPeer(ClosesOnce):
    """The peer connection of one client and the RealtimeSession it carries (`session`)."""

    def __init__(
        self,
        context: ServerContext,
        admitted: Admitted,
        conversation_id: str | None,
        shape: EventShape | None = None,
        channels: tuple[str, ...] = (EVENTS_CHANNEL,),
    ):
        """conversation_id: the stored conversation the client continues (None: a new one);
        shape: how its events are named and shaped (None: GA over WebRTC); channels: the labels
        its events' data channel may have."""
        self.id = admitted.session_id
        self.call_id = f"rtc_{secrets.token_hex(16)}"
        self._release = admitted.release
        metrics = self._metrics = context.metrics
        config = context.config
        ice = [RTCIceServer(**server) for server in ice_servers(config, time.time())]
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=ice))
        self.track = MeteredPlaybackTrack(on_underrun=metrics.note_underrun)
        self.session = RealtimeSession(
            context,
            admitted,
            self._send,
            self.track,
            conversation_id,
            shape=shape if shape is not None else event_shape("ga", webrtc=True),
        )
        self._channel: RTCDataChannel | None = None
        self._channel_labels = channels
        self._outbox: list[dict] = []  # events sent before the data channel opened
        self._inbox: asyncio.Queue[str | bytes] = asyncio.Queue()  # the channel's messages, handled in order
        self._watchers: list[CallWatcher] = []  # sideband connections (sideband.py)
        self._tasks = OwnedTasks(f"session {self.id}", quiet=HANG_UPS)
        self._has_audio_track = False

    # ----- signalling -----
    async def accept(self, offer: RTCSessionDescription) -> RTCSessionDescription:
        """Answer the client's offer (handlers first, then the descriptions)."""
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("connectionstatechange", self._on_connection_state)
        await self.pc.setRemoteDescription(offer)
        if not self._has_audio_track:
            raise KimiAudioError("the offer has no audio track: send the microphone with the offer")
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        self.session.start()
        return self.pc.localDescription

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio" or self._has_audio_track:
            return
        self._has_audio_track = True
        self.pc.addTrack(self.track)
        self._tasks.spawn(self._read_audio(track), "reading audio")

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if self._channel is not None or channel.label not in self._channel_labels:
            labels = " or ".join(map(repr, self._channel_labels))
            log.info(
                "session %s: data channel %r left unused (the events' is the first %s)", self.id, channel.label, labels
            )
            return
        self._channel = channel
        channel.on("message", self._inbox.put_nowait)
        self._tasks.spawn(self._read_events(), "reading client events")
        self.session.send_created()
        outbox, self._outbox = self._outbox, []
        for event in outbox:
            self._send_now(event)

    def _on_connection_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self._tasks.spawn(self.close(f"connection {self.pc.connectionState}"), "closing")

    # ----- sideband connections -----
    def watch(self, watcher: CallWatcher) -> None:
        """`watcher` gets every event of the call's session from now on but the data channel's
        session.created, until the call ends (then it is closed) or it is unwatched."""
        self._watchers.append(watcher)

    def unwatch(self, watcher: CallWatcher) -> None:
        if watcher in self._watchers:
            self._watchers.remove(watcher)

    # ----- events out -----
    def _send(self, event: dict) -> None:
        if event["type"] != "session.created":  # (each connection's own: a sideband sent its own as it joined)
            for watcher in list(self._watchers):
                watcher.send(event)
        if self._channel is None or self._channel.readyState != "open":
            if len(self._outbox) < MAX_OUTBOX:
                self._outbox.append(event)
            return
        if self.pc.connectionState != "connected":
            # Gone (or going): aiortc would send from a task of its own that fails with a
            # ConnectionError nobody retrieves, logged as an ERROR traceback per hang-up.
            log.debug("session %s: not connected, %s not sent", self.id, event["type"])
            return
        self._send_now(event)

    def _send_now(self, event: dict) -> None:
        if self._channel is None:
            return
        text = json.dumps(event)
        try:
            self._channel.send(text)
        except ValueError as exc:  # more than the peer takes in one message (its max-message-size)
            if event["type"] == "error":
                return
            log.warning("session %s: %s of %d bytes not sent: %s", self.id, event["type"], len(text), exc)
            self._send_now({"event_id": event.get("event_id"), **too_large_error(event, len(text), str(exc))})
        except Exception as exc:  # the channel went away under us; closing will follow
            log.debug("session %s: could not send %s: %s", self.id, event["type"], exc)

    async def _read_events(self) -> None:
        while True:
            await self.session.handle_message(await self._inbox.get())

    # ----- audio in -----
    async def _read_audio(self, track: MediaStreamTrack) -> None:
        reason = "the client hung up"
        try:
            clock = InputClock(self.id, self._metrics.note_input_dropped)
            connected = lambda: self.pc.connectionState == "connected"  # noqa: E731
            reason = await read_microphone(track, self.session, clock, connected, lambda: self.closed)
        finally:
            self._tasks.spawn(self.close(reason), "closing")

    # ----- lifetime -----
    @property
    def is_answering(self) -> bool:
        return self.session.is_answering

    async def _close(self, reason: str, shutdown: bool) -> None:
        """Close the session (storing what was heard), stop every task, close the peer and its
        sideband connections (once: closes_once.py)."""
        try:
            await self.session.close(shutdown)
        finally:
            for watcher in list(self._watchers):  # (after the session's last events reached them)
                await watcher.close(f"the call ended: {reason}", shutdown)
            await self._tasks.stop()
            self.track.stop()
            await self.pc.close()
            self._release()
            log.info("session %s closed: %s", self.id, reason)


@dataclass(frozen=True)
class RtcOffer:
    """A client's request for a WebRTC session, its parts checked where they entered."""

    sdp: str  # checked by answer_offer (inputs/sdp_offer.py)
    updates: tuple[SessionUpdate, ...] = ()  # session settings to start with, applied in order
    conversation_id: str | None = None  # a stored conversation to continue
    shape: EventShape | None = None  # its events' (None: GA over WebRTC)
    channels: tuple[str, ...] = (EVENTS_CHANNEL,)  # the labels its events' data channel may have


async def answer_offer(context: ServerContext, offer: RtcOffer) -> tuple[RtcPeer, RTCSessionDescription]:
    """Let the client in (the module docstring's steps) -> (its peer, the SDP answer)."""
    if offer.conversation_id is not None and await context.store.get_conversation(offer.conversation_id) is None:
        shown = offer.conversation_id[:80]
        raise ApiError(404, "conversation_not_found", f"no conversation with id {shown!r}", param="conversation_id")
    check_offer(offer.sdp)

    async def make(admitted: Admitted) -> RtcPeer:
        return RtcPeer(context, admitted, offer.conversation_id, offer.shape, offer.channels)

    # The slot is checked and taken in one step, after the body is in: a stalled body holds none.
    async with context.sessions.opened("webrtc", make) as peer:
        await peer.session.conversation.open()  # its lease: 409 conversation_busy if held elsewhere
        for update in (*_call_defaults(context), *offer.updates):
            await peer.session.settings.fetch_voices(update)
            try:
                peer.session.apply_update(update, announce=False)
            except KimiAudioError as exc:
                raise ApiError(400, "invalid_value", str(exc)) from None
        answer = await _accept(peer, offer.sdp)
    return peer, answer


def _call_defaults(context: ServerContext) -> tuple[SessionUpdate, ...]:
    """What a call starts with beyond a WebSocket session's defaults: the user's words
    transcribed (`[server] transcribe_input`), unless its own settings say otherwise."""
    return (SessionUpdate(transcription=Transcription()),) if context.config.server.transcribe_input else ()


def find_call(live: list[Transport], call_id: str) -> RtcPeer | None:
    """The live WebRTC session with this call id, among the registry's `live` transports."""
    return next((t for t in live if isinstance(t, RtcPeer) and t.call_id == call_id and not t.closed), None)


async def _accept(peer: RtcPeer, sdp: str) -> RTCSessionDescription:
    try:
        return await peer.accept(RTCSessionDescription(sdp=sdp, type="offer"))
    except KimiAudioError as exc:
        raise ApiError(400, "bad_offer", str(exc)) from None
    except Exception as exc:  # aiortc refusing an offer that passed our checks (e.g. no common codec)
        log.info("session %s: aiortc refused the offer (%s: %s)", peer.id, type(exc).__name__, exc)
        raise ApiError(
            400, "bad_offer", "the SDP offer could not be used (no common audio codec or transport?)"
        ) from None
