"""RtcPeer.close called twice (the client's hang-up, then the app's shutdown): the second
call returns only once the first has stored what it stores and stopped the session's tasks,
so the shutdown cannot stop the VAD thread and the store under a session still closing."""

import asyncio
import time

import pytest

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.server.app_keys import sessions_key
from test_server_support import demo_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


async def test_a_second_close_waits_for_the_first(aiohttp_client, demo_checkpoint, tmp_path):
    async with demo_server(aiohttp_client, demo_checkpoint, tmp_path) as (http, _):
        client = RtcClient(ScriptedMic())
        assert (await client.connect(http))[0] == 200
        await client.wait_for("session.created")
        (session,) = http.app[sessions_key].values()
        real_close = session.session.close

        async def slow_close():  # storing an interrupted answer takes a while
            await asyncio.sleep(0.5)
            await real_close()

        session.session.close = slow_close
        first = asyncio.ensure_future(session.close("the client hung up"))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await session.close("the server is stopping")
        assert time.monotonic() - started > 0.3 and first.done()
        await asyncio.sleep(0.05)  # the close the peer's "closed" state spawned finds it done
        assert not session._tasks  # every task of the session is over
        await client.close()
