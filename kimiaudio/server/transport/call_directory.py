"""Calls by their id, fleet-wide: a hang-up ends its call whichever instance it reaches.

A WebRTC call lives on the instance that answered its offer; behind HAProxy, a later
`POST /v1/realtime/calls/{call_id}/hangup` may reach any instance. So every call is written
to the shared database's directory of calls as it is answered (`open_call`; store/calls.py),
and each instance syncs its own calls there every SYNC_S (`call_directory`, a cleanup
context): it renews their rows, forgets the ended ones, and ends those another instance
marked. `hang_up` ends a call held here at once; else it marks the call's row, and the
holder ends it at its next sync (within about SYNC_S). A database that does not answer only
loses that: the calls go on, and a hang-up reaching their own instance still ends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web
from aiortc import RTCSessionDescription

from kimiaudio.server.context import SERVER_CONTEXT, ServerContext
from kimiaudio.server.transport.rtc_peer import RtcOffer, RtcPeer, answer_offer, find_call
from kimiaudio.store.calls import register_call, request_hangup, sync_calls

log = logging.getLogger(__name__)

SYNC_S = 1.0  # how often an instance renews its calls and looks for hang-ups asked elsewhere
TTL_S = 10.0  # a call's row outlives its last renewal by this much (a killed instance's expire)


async def open_call(context: ServerContext, offer: RtcOffer) -> tuple[RtcPeer, RTCSessionDescription]:
    """answer_offer (rtc_peer.py), and the call written to the directory."""
    peer, answer = await answer_offer(context, offer)
    try:
        await register_call(context.store, peer.call_id, TTL_S)
    except Exception as exc:  # the database is away: the call goes on, hung up only where it lives
        log.warning("call %s not in the shared directory: %s", peer.call_id, exc)
    return peer, answer


async def hang_up(context: ServerContext, call_id: str) -> bool:
    """End the call (here, or through the directory) -> False if no live call has this id."""
    peer = find_call(context.sessions.live(), call_id)
    if peer is not None:
        await peer.close("hung up (POST /v1/realtime/calls/{call_id}/hangup)")
        return True
    return await request_hangup(context.store, call_id)


async def call_directory(app: web.Application) -> AsyncIterator[None]:
    """Cleanup context: this instance's calls kept in step with the directory while the app runs."""
    task = asyncio.get_running_loop().create_task(_sync_forever(app[SERVER_CONTEXT]))
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _sync_forever(context: ServerContext) -> None:
    known: set[str] = set()  # the calls live at the last sync
    failing = False
    while True:
        await asyncio.sleep(SYNC_S)
        peers = {t.call_id: t for t in context.sessions.live() if isinstance(t, RtcPeer) and not t.closed}
        ended = known - peers.keys()
        if not peers and not ended:
            continue
        try:
            asked = await sync_calls(context.store, list(peers), list(ended), TTL_S)
        except Exception as exc:  # StoreUnavailableError: tried again at the next sync
            if not failing:
                log.warning("cannot sync the calls with the shared directory: %s", exc)
            failing = True
            continue
        failing = False
        known = set(peers)
        for call_id in asked:
            if call_id in peers:
                await peers[call_id].close("hung up through another instance")
