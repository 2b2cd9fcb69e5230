"""RtcPeer.close called twice (the client's hang-up, then the app's shutdown): the second
call returns only once the first has stored what it stores and stopped the session's tasks,
so the shutdown cannot stop the VAD thread and the store under a session still closing."""

import asyncio

import pytest

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.server.context import SERVER_CONTEXT

from helpers.waiting import eventually

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


async def test_a_second_close_waits_for_the_first(demo_server):
    async with demo_server() as (http, _):
        client = RtcClient(ScriptedMic())
        assert (await client.connect(http))[0] == 201
        await client.wait_for("session.created")
        (session,) = http.app[SERVER_CONTEXT].sessions.live()
        real_close = session.session.close
        closing, stored = asyncio.Event(), asyncio.Event()

        async def slow_close(shutdown: bool = False):  # storing an interrupted answer takes a while: until `stored`
            closing.set()
            await stored.wait()
            await real_close(shutdown)

        session.session.close = slow_close
        first = asyncio.ensure_future(session.close("the client hung up"))
        await closing.wait()  # the first close is storing
        second = asyncio.ensure_future(session.close("the server is stopping"))
        # However long the first one stores, the second waits for it. (The expiry only proves an
        # absence: a slow machine could let a close that does not wait pass, never fail one that does.)
        await asyncio.wait([second], timeout=0.5)
        assert not second.done() and not first.done()
        stored.set()
        await second
        assert first.done()

        async def tasks_over():  # the close the peer's "closed" state spawned finds it done
            return not session._tasks

        await eventually(tasks_over, "every task of the session over")
        await client.close()
