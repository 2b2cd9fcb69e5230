"""A real WebRTC client for loopback use: the bench drives the server with it, and so do the
tests. It calls as OpenAI's Realtime WebRTC clients do (the SDP offer to POST
/v1/realtime/calls, the events on a data channel named `oai-events`), speaks 16 kHz clips
through an aiortc audio track paced in real time, and records the server's events and the
loudness of every audio frame it receives."""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from collections.abc import Mapping

import numpy as np
from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame

from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.errors import KimiAudioError

CALLS = "/v1/realtime/calls"
EVENTS_CHANNEL = "oai-events"  # the data channel OpenAI's clients open


class ScriptedMic(MediaStreamTrack):
    """A microphone the test controls: silence, or the clips given to `say` (16 kHz), in
    20 ms frames paced in real time. `hang()` stops producing frames (a vanished client)."""

    kind = "audio"

    def __init__(self):
        super().__init__()
        self._queue: list[np.ndarray] = []
        self._pts = 0
        self._start = None
        self._hung = False

    def say(self, pcm16k: np.ndarray) -> None:
        self._queue.append(np.asarray(pcm16k, dtype=np.float32))

    def hang(self) -> None:
        self._hung = True

    async def recv(self):
        if self.readyState != "live":
            raise MediaStreamError
        if self._hung:
            await asyncio.Event().wait()
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += 320
            await asyncio.sleep(max(0.0, self._start + self._pts / SPEECH_INPUT_RATE - time.monotonic()))
        samples = np.zeros(320, dtype=np.float32)
        filled = 0
        while filled < 320 and self._queue:
            clip = self._queue[0]
            n = min(320 - filled, clip.size)
            samples[filled : filled + n] = clip[:n]
            filled += n
            self._queue[0] = clip[n:]
            if self._queue[0].size == 0:
                self._queue.pop(0)
        frame = AudioFrame(format="s16", layout="mono", samples=320)
        frame.planes[0].update((np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes())
        frame.pts, frame.sample_rate, frame.time_base = (
            self._pts,
            SPEECH_INPUT_RATE,
            fractions.Fraction(1, SPEECH_INPUT_RATE),
        )
        return frame


class RtcClient:
    """A real aiortc peer talking to the server: sends `mic`, records events and audio."""

    def __init__(self, mic: MediaStreamTrack):
        self.pc = RTCPeerConnection()
        self.mic = mic
        self.events: list[dict] = []
        self._new_event = asyncio.Condition()
        self.frames_rms: list[float] = []  # one per received 20 ms frame
        self.channel: RTCDataChannel | None = None
        self.call_id: str | None = None
        self.response_headers: Mapping[str, str] = {}
        self._tasks: list[asyncio.Future] = []

    async def connect(
        self, http, session: dict | None = None, conversation_id: str | None = None, key: str | None = None
    ) -> tuple[int, dict]:
        """Call the server (`http`: an aiohttp client of it) -> (status, {"call_id", "sdp"} when
        answered (201), else the error body). `session`: a session object, sent as the
        multipart form's `session` part (without one, the offer goes as plain application/sdp);
        `conversation_id`: a stored conversation to continue; `key`: the Bearer token (an
        ephemeral key), instead of what `http` sends."""
        import aiohttp

        sdp = await self.offer()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body: str | aiohttp.FormData = sdp
        if session is None:
            headers["Content-Type"] = "application/sdp"
        else:
            body = aiohttp.FormData()
            body.add_field("sdp", sdp, content_type="application/sdp")
            body.add_field("session", json.dumps(session), content_type="application/json")
        params = {"conversation_id": conversation_id} if conversation_id else {}
        resp = await http.post(CALLS, data=body, headers=headers, params=params)
        self.response_headers = resp.headers  # e.g. Retry-After of a 409 or 503
        if resp.status != 201:
            return resp.status, await resp.json()
        answer = await resp.text()
        await self.answered(answer, resp.headers["Location"])
        return resp.status, {"call_id": self.call_id, "sdp": answer}

    async def offer(self) -> str:
        """The SDP offer (the microphone and the `oai-events` channel), for a call made by other means."""
        channel = self.channel = self.pc.createDataChannel(EVENTS_CHANNEL)
        channel.on("message", self._on_message)
        self.pc.addTrack(self.mic)
        self.pc.on("track", lambda track: self._tasks.append(asyncio.ensure_future(self._consume(track))))
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def answered(self, sdp: str, location: str) -> None:
        """The server's SDP answer and the call's Location (its last segment is the call id)."""
        self.call_id = location.rsplit("/", 1)[-1]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))

    async def hang_up(self, http) -> int:
        """POST /v1/realtime/calls/{call_id}/hangup -> its status."""
        resp = await http.post(f"{CALLS}/{self.call_id}/hangup")
        return resp.status

    def _on_message(self, message):
        event = json.loads(message)
        self.events.append(event)

        async def notify():
            async with self._new_event:
                self._new_event.notify_all()

        asyncio.ensure_future(notify())

    async def _consume(self, track):
        try:
            while True:
                frame = await track.recv()
                pcm = frame.to_ndarray().astype(np.float32) / 32768.0
                self.frames_rms.append(float(np.sqrt(np.mean(pcm**2))))
        except MediaStreamError:
            pass

    def send(self, event: dict) -> None:
        if self.channel is None:
            raise KimiAudioError("send: connect first")
        self.channel.send(json.dumps(event))

    def of_type(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["type"] == kind]

    async def wait_for(self, kind: str, count: int = 1, timeout: float = 120.0, where=None) -> dict:
        """The `count`-th event of type `kind` (optionally also matching `where(event)`). The
        default limit catches a hang, not slowness (a loaded machine can take many seconds)."""

        def matches():
            found = [e for e in self.of_type(kind) if where is None or where(e)]
            return found[count - 1] if len(found) >= count else None

        async def wait():
            async with self._new_event:
                while matches() is None:
                    await self._new_event.wait()
            return matches()

        try:
            return await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            got = [e["type"] for e in self.events]
            raise AssertionError(f"no {kind} #{count} within {timeout} s; events so far: {got}") from None

    async def close(self):
        for t in self._tasks:
            t.cancel()
        await self.pc.close()
