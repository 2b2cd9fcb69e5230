"""A Realtime client that stops reading while it keeps asking (server/transport/ws_outbox.py):
what waits for it is bounded in bytes, not in events. Retrieving an item of a minute of audio
over and over without reading gets the client cut for reading too slowly once about
MAX_OUTBOX_BYTES wait for it, a few events in, where a count of events would let gigabytes
pile up; the server goes on serving the next client."""

import base64
import json

import numpy as np
import pytest

from kimiaudio.server.transport.ws_outbox import MAX_OUTBOX_BYTES

from helpers.realtime_events import MODEL
from helpers.waiting import eventually

websockets = pytest.importorskip("websockets")
pytestmark = pytest.mark.slow

AUDIO_S = 60  # of 24 kHz pcm16: about 3.8 MB of base64 in each retrieved item


async def test_a_client_that_stops_reading_is_cut_by_the_bytes_waiting_for_it(v1_serve):
    proc, base_url = v1_serve
    url = base_url.replace("http", "ws", 1) + f"/v1/realtime?model={MODEL}"
    audio = np.random.default_rng(0).integers(-3000, 3000, 24000 * AUDIO_S, dtype=np.int16).tobytes()
    content = [{"type": "input_audio", "audio": base64.b64encode(audio).decode()}]
    # Twice the limit's worth of retrieves: a few dozen events, far under any count of events a
    # limit would have to allow for the audio deltas of an answer.
    retrieves = 2 * MAX_OUTBOX_BYTES // len(content[0]["audio"]) + 2
    # max_queue=1: the client library stops reading the socket once one message waits unread.
    async with websockets.connect(url, max_queue=1, max_size=None) as ws:
        session_id = json.loads(await ws.recv())["session"]["id"]
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "turn_detection": None}}))
        item = {"id": "item_big", "type": "message", "role": "user", "content": content}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        for _ in range(retrieves):
            await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": "item_big"}))

        async def cut():  # (the server's heartbeat would close it too, later, and say otherwise)
            return any(f"session {session_id}: the client reads too slowly" in line for line in proc.output_lines)

        await eventually(cut, "the client cut for reading too slowly")
        ws.transport.abort()  # (a client that reads nothing learns of the cut only by its keepalive)

    async with websockets.connect(url) as ws:  # the server serves the next client
        assert json.loads(await ws.recv())["type"] == "session.created"
