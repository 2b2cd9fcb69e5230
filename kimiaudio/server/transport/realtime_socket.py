"""One Realtime WebSocket client (GET /v1/realtime): the connection carrying a RealtimeSession.

The same RealtimeSession as WebRTC's, fed by JSON text messages instead of RTP and a data
channel, its events in the shape the client asked for at the upgrade (GA or beta: v1/realtime.py):
`input_audio_buffer.append` carries base64 pcm16 (24 kHz, or 16 kHz when the session says so),
resampled to 16 kHz for the VAD and the encoders; the answer's audio goes out as
`response.output_audio.delta` (beta: `response.audio.delta`) events through a WsPlayback.
Events go out in order through one writer task (ws_outbox.py); a client that reads too slowly
to keep MAX_OUTBOX_BYTES of events in flight, or that disconnects, closes the session, which cancels its
turn (KV and detokenizer state freed) and stores what was heard.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import WSMsgType, web

from kimiaudio.audio import pcm16
from kimiaudio.server.context import ServerContext
from kimiaudio.server.session import response_events
from kimiaudio.server.session.event_shape import EventShape
from kimiaudio.server.session.realtime_session import RealtimeSession
from kimiaudio.server.session_registry import Admitted
from kimiaudio.server.transport.closes_once import ClosesOnce
from kimiaudio.server.transport.ws_outbox import WsOutbox
from kimiaudio.server.transport.ws_playback import WsPlayback

log = logging.getLogger(__name__)

MAX_WS_MESSAGE_BYTES = 16 * 1024 * 1024  # an append of up to ~4 min of base64 pcm16 24 kHz


class RealtimeSocket(ClosesOnce):
    """The WebSocket of one client and the RealtimeSession it carries (`session`)."""

    def __init__(
        self,
        context: ServerContext,
        admitted: Admitted,
        ws: web.WebSocketResponse,
        transport: asyncio.Transport | None,
        shape: EventShape,
    ):
        """transport: the WebSocket's connection (its request's); shape: the events' (GA or beta;
        never WebRTC's: the client plays the audio deltas)."""
        self.id = admitted.session_id
        self.ws = ws
        self._release = admitted.release
        self._outbox = WsOutbox(ws, transport, f"session {self.id}")
        self.playback = WsPlayback(self._send_audio)
        self.session = RealtimeSession(context, admitted, self._outbox.send, self.playback, shape=shape)

    @property
    def is_answering(self) -> bool:
        return self.session.is_answering

    async def run(self) -> None:
        """Serve the connection until the client goes away (the route handler's body)."""
        self._outbox.start()
        self.session.start()
        self.session.send_created()
        try:
            async for message in self.ws:
                if message.type == WSMsgType.TEXT:
                    await self.session.handle_message(message.data, MAX_WS_MESSAGE_BYTES)
                elif message.type == WSMsgType.BINARY:
                    self.session.events.error("invalid_event", "send events as JSON text messages")
                elif message.type == WSMsgType.ERROR:
                    break
                if self._outbox.dropped:
                    break
                await asyncio.sleep(0)  # the writer's turn: a burst of events in must not starve it
        finally:
            await self.close("the connection ended")

    # ----- events out -----
    def _send_audio(self, response_id: str, raw: bytes) -> None:
        response = self.session.response
        item_id = response.item_id if response is not None and response.id == response_id else ""
        self.session.events.send(response_events.audio_delta(response_id, item_id, pcm16.to_base64(raw)))

    # ----- lifetime -----
    async def _close(self, reason: str, shutdown: bool) -> None:
        """Cancel the turn in progress (storing what was heard), send the last events, close (once:
        closes_once.py)."""
        try:
            await self.session.close(shutdown)
        finally:
            await self._outbox.finish(going_away=shutdown)  # what is queued (response.done) goes out first
            self._release()
            log.info("session %s closed: %s", self.id, reason)
