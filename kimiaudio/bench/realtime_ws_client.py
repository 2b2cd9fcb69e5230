"""A loopback client for the OpenAI Realtime protocol over WebSocket (`GET /v1/realtime`).

Written against the protocol, not against this server's code, so the soak can drive any
Realtime endpoint: microphone audio goes out as `input_audio_buffer.append` events (base64
pcm16, 24 kHz mono, 100 ms per event, paced in real time), the server's VAD commits turns,
answers come back as `response.audio.delta` (or the GA name `response.output_audio.delta`),
`response.cancel` interrupts. Every server event is recorded for the caller to wait on, as
RtcClient (loopback_client.py) does for the data channel.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

import numpy as np

from kimiaudio.audio import pcm16
from kimiaudio.audio.rates import OPENAI_PCM16_RATE, SPEECH_INPUT_RATE
from kimiaudio.audio.resampling import resample
from kimiaudio.errors import KimiAudioError
from kimiaudio.server.inputs.openai_params import MODEL_ID

CHUNK_S = 0.1
AUDIO_DELTAS = ("response.audio.delta", "response.output_audio.delta")


class RealtimeWsClient:
    def __init__(self):
        self.ws = None
        self.events: list[dict] = []
        self._changed = asyncio.Event()
        self._reader: asyncio.Task | None = None
        self._speaking: asyncio.Task | None = None
        self.audio_received_s = 0.0

    async def connect(self, http, path: str = f"/v1/realtime?model={MODEL_ID}", headers: dict | None = None) -> int:
        """The HTTP status of the upgrade (101 when connected; 404: no such endpoint)."""
        import aiohttp

        try:
            self.ws = await http.ws_connect(path, headers=headers or {}, heartbeat=None)
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status
        self._reader = asyncio.ensure_future(self._read(self.ws))
        return 101

    async def _read(self, ws) -> None:
        import aiohttp

        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            event = json.loads(message.data)
            if event.get("type") in AUDIO_DELTAS:  # keep the size, not the audio
                self.audio_received_s += len(base64.b64decode(event.get("delta", ""))) / 2 / OPENAI_PCM16_RATE
                event = {"type": event["type"], "response_id": event.get("response_id")}
            self.events.append(event)
            self._changed.set()
        self._changed.set()

    @property
    def closed(self) -> bool:
        return self.ws is None or self.ws.closed

    async def send(self, event: dict | str) -> None:
        if self.ws is None:
            raise KimiAudioError("send: connect first")
        await self.ws.send_str(event if isinstance(event, str) else json.dumps(event))

    def say(self, pcm16k: np.ndarray, silence_s: float = 1.2) -> asyncio.Task:
        """Stream `pcm16k` (16 kHz float) then `silence_s` of silence, in real time, in the background."""
        pcm = np.concatenate(
            [
                resample(pcm16k, SPEECH_INPUT_RATE, OPENAI_PCM16_RATE),
                np.zeros(int(silence_s * OPENAI_PCM16_RATE), np.float32),
            ]
        )
        self._speaking = asyncio.ensure_future(self._stream(pcm))
        return self._speaking

    async def _stream(self, pcm: np.ndarray) -> None:
        step = int(CHUNK_S * OPENAI_PCM16_RATE)
        start = time.monotonic()
        for i, offset in enumerate(range(0, pcm.size, step)):
            await asyncio.sleep(max(0.0, start + i * CHUNK_S - time.monotonic()))
            if self.closed:
                return
            chunk = pcm16.to_base64(pcm16.to_bytes(pcm[offset : offset + step]))
            await self.send({"type": "input_audio_buffer.append", "audio": chunk})

    def of_type(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("type") == kind]

    async def wait_for(self, kind: str, count: int = 1, timeout: float = 120.0, where=None) -> dict:
        """The `count`-th event of type `kind`; the default limit catches a hang, not slowness."""
        deadline = time.monotonic() + timeout
        while True:
            found = [e for e in self.of_type(kind) if where is None or where(e)]
            if len(found) >= count:
                return found[count - 1]
            if self.closed and self._reader is not None and self._reader.done():
                raise AssertionError(f"the WebSocket closed before {kind} #{count}")
            left = deadline - time.monotonic()
            if left <= 0:
                got = [e.get("type") for e in self.events]
                raise AssertionError(f"no {kind} #{count} within {timeout} s; got {got}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                pass

    async def close(self) -> None:
        for task in (self._speaking, self._reader):
            if task is not None:
                task.cancel()
        if self.ws is not None:
            await self.ws.close()
