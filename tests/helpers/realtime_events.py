"""A Realtime client's side for the /v1 tests (the official `openai` client): events read in the
background (each checked strictly against the SDK's models of the connection's shape), speech
appended as pcm16, a conversation read back."""

import asyncio
import base64
import json
import time

import aiohttp
import numpy as np

from kimiaudio.audio import pcm16
from kimiaudio.audio.resampling import resample

from helpers.openai_strict import check, named

MODEL = "kimi-audio-7b-instruct"


class Events:
    """Reads a Realtime connection in the background; the events as the client parsed them.
    `api`: the shape the connection speaks ("ga": client.realtime.connect(), "beta":
    client.beta.realtime.connect()); every event is checked against the SDK's models of that
    shape (helpers/openai_strict.py) and a wait fails at the first that does not hold. Events
    are named in GA (`of_type`, `wait_for`), whatever the shape. Waits are for events, with
    timeouts only there to end a hung test (minutes: a loaded machine's demo model may generate
    slower than real time)."""

    def __init__(self, conn, api: str):
        self.conn = conn
        self.api = api
        self.items: list = []
        self.raw: list[dict] = []  # the events as sent (JSON)
        self.arrived: list[float] = []  # time.monotonic() of each event's arrival
        self.invalid: list[str] = []  # what strict validation said of each event that failed it
        self._changed = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self):
        from websockets.exceptions import ConnectionClosed

        try:
            while True:
                try:
                    data = await self.conn.recv_bytes()
                except ConnectionClosed:
                    return
                raw = json.loads(data)
                try:
                    check(raw, self.api)
                except Exception as exc:
                    self.invalid.append(f"{raw.get('type')}: {exc}")
                self.raw.append(raw)
                self.items.append(self.conn.parse_event(data))
                self.arrived.append(time.monotonic())
                self._changed.set()
        finally:
            self._changed.set()

    def position(self, event) -> int:
        """Where `event` came among all the events so far."""
        return next(i for i, e in enumerate(self.items) if e is event)

    def of_type(self, kind: str) -> list:
        """The events named `kind` in GA (their beta name on a beta connection)."""
        kind = named(kind, self.api)
        return [e for e in self.items if e.type == kind]

    async def until(self, ready, timeout: float = 300.0):
        """Waits until ready() is true (checked at each event), returns its value."""

        async def wait():
            while True:
                if self.invalid:
                    raise AssertionError(f"events the SDK's {self.api} models do not hold: {self.invalid}")
                if value := ready():
                    return value
                if self.task.done():
                    raise AssertionError(f"the connection ended: {[e.type for e in self.items]}")
                self._changed.clear()
                await self._changed.wait()

        try:
            return await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"not ready in {timeout} s: {[e.type for e in self.items]}") from None

    async def wait_for(self, kind: str, count: int = 1, timeout: float = 300.0):
        await self.until(lambda: len(self.of_type(kind)) >= count, timeout)
        return self.of_type(kind)[count - 1]

    def done(self, response_id: str):
        """The response.done of response_id, or None."""
        return next((e for e in self.of_type("response.done") if e.response.id == response_id), None)

    def audio_seconds(self, response_id: str) -> float:
        return (
            sum(
                len(base64.b64decode(e.delta)) // 2
                for e in self.of_type("response.output_audio.delta")
                if e.response_id == response_id
            )
            / 24000
        )


async def say(conn, pcm16k: np.ndarray, chunk_s: float = 0.1) -> None:
    """Append 16 kHz speech as OpenAI's pcm16 (24 kHz), in 100 ms messages."""
    pcm = pcm16.to_bytes(resample(pcm16k, 16000, 24000))
    step = int(chunk_s * 24000) * 2
    for start in range(0, len(pcm), step):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[start : start + step]).decode())
        await asyncio.sleep(0.005)


async def conversation(base_url: str, conversation_id: str) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base_url}/api/conversations/{conversation_id}") as resp:
            return await resp.json()
