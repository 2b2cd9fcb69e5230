"""Sideband: a second connection to a WebRTC call's session, as OpenAI's GA API has it
(`GET /v1/realtime?call_id=rtc_...`, the `openai` client's `realtime.connect(call_id=...)`): a
server beside the browser that watches the call and steers it.

It starts with a session.created of its own that describes the session as it is now, as each
new connection does, whether or not the call's data channel has opened or ever will (a call
may have none). Then it gets every other event of the call's session from when it joined, the
same events the call's data channel carries (GA's shape, with the same event ids; a call of
the deprecated beta-shaped offer route cannot be joined). Its client events are the
session's: a session.update, a response.create or a conversation.item.create from it act on
the call (audio too: an input_audio_buffer.append is heard as the microphone is). The session
does not tell its connections apart: what answers a client event (an error, a retrieved item)
goes to the call's channel and to every sideband alike. It takes no session slot of its own,
and closing it leaves the call going; the call's end closes it. A client too slow to read its
events is dropped and closed (ws_outbox.py).
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import WSMsgType, web

from kimiaudio.server.session import server_events
from kimiaudio.server.transport.closes_once import ClosesOnce
from kimiaudio.server.transport.realtime_socket import MAX_WS_MESSAGE_BYTES
from kimiaudio.server.transport.rtc_peer import RtcPeer
from kimiaudio.server.transport.ws_outbox import WsOutbox

log = logging.getLogger(__name__)


class Sideband(ClosesOnce):
    def __init__(self, peer: RtcPeer, ws: web.WebSocketResponse, transport: asyncio.Transport | None):
        """transport: the WebSocket's connection (its request's)."""
        self.peer = peer
        self.ws = ws
        self._outbox = WsOutbox(ws, transport, f"call {peer.call_id}: sideband")
        self._own_events = 0  # events sent to this connection alone

    async def run(self) -> None:
        """Serve the connection until it or the call ends (the route handler's body)."""
        self._outbox.start()
        session = self.peer.session
        self._send_own(server_events.session_created(session.describe()))
        self.peer.watch(self)
        log.info("call %s: a sideband connection joined (session %s)", self.peer.call_id, session.id)
        try:
            async for message in self.ws:
                if message.type == WSMsgType.TEXT:
                    await session.handle_message(message.data, MAX_WS_MESSAGE_BYTES)
                elif message.type == WSMsgType.BINARY:
                    self._send_own(server_events.error("invalid_event", "send events as JSON text messages"))
                elif message.type == WSMsgType.ERROR:
                    break
                if self._outbox.dropped or self.peer.closed:
                    break
                await asyncio.sleep(0)  # the writer's turn: a burst of events in must not starve it
        finally:
            await self.close("the sideband connection ended")

    def send(self, event: dict) -> None:
        """One of the call's events (already shaped and numbered by its session)."""
        self._outbox.send(event)

    def _send_own(self, event: dict) -> None:
        """An event for this connection alone, shaped as the call's are."""
        shaped = self.peer.session.events.shape.event(event)
        if shaped is not None:
            self._own_events += 1
            self._outbox.send({"event_id": f"evt_sideband_{self._own_events}", **shaped})

    async def _close(self, reason: str, shutdown: bool) -> None:
        self.peer.unwatch(self)
        await self._outbox.finish(going_away=shutdown)
        log.info("call %s: the sideband connection closed: %s", self.peer.call_id, reason)
