"""The GPU machine's first check: `serve` as a user starts it, one spoken turn through each API.

Starts `python -m kimiaudio serve` with the default configuration (device auto, weights auto,
the demo checkpoint written under a scratch data directory; only the port is chosen), waits
until /readyz answers, then:
- a Realtime WebSocket session (/v1/realtime) streams the committed speech fixture
  (tests/data/speech_hello_16k.wav, at 24 kHz) and a second of silence; the server's VAD
  commits the turn and the answer is streamed back (response.audio.delta ... response.done);
- POST /v1/chat/completions sends the same speech as input_audio and asks for text and audio.
Prints one JSON report (what each answer held, timings, the server's device and memory plan
lines) and exits 0 when both turns answered with audio on the expected device, 1 otherwise.
Needs only what the GPU machine has: aiohttp and numpy (and the project's wheels for serve).
`.ci/gpu-check smoke` runs it; elsewhere `--expect-device cpu` checks the same on a CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SPEECH = ROOT / "tests" / "data" / "speech_hello_16k.wav"
REALTIME_RATE = 24000  # OpenAI Realtime pcm16
MODEL = "kimi-audio-7b-instruct"
PLAN_LINE = re.compile(r"  device: |memory plan for|LM KV pool|weights: LM|fits|does NOT fit|WARNING|ERROR|Traceback")
DEVICE_LINE = re.compile(r"^  device: (\S+)")
NOISE = re.compile(r"nanobind: | - leaked |See https://nanobind")  # triton's bindings at interpreter exit


def speech_16k() -> np.ndarray:
    with wave.open(str(SPEECH)) as wav:
        if wav.getframerate() != 16000 or wav.getnchannels() != 1 or wav.getsampwidth() != 2:
            raise SystemExit(f"{SPEECH}: expected 16 kHz mono PCM16")
        return np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.float32) / 32768


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm16(samples))
    return out.getvalue()


def to_24k(samples: np.ndarray) -> np.ndarray:
    """Linear interpolation to 24 kHz: enough for a VAD and a speech encoder to hear words."""
    n = int(round(samples.size * REALTIME_RATE / 16000))
    return np.interp(np.arange(n) * 16000 / REALTIME_RATE, np.arange(samples.size), samples).astype(np.float32)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_ready(http, base: str, server: subprocess.Popen, limit_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        if server.poll() is not None:
            raise RuntimeError(f"serve exited with status {server.returncode} before it was ready")
        try:
            async with http.get(f"{base}/readyz") as response:
                if response.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError(f"serve was not ready within {limit_s:.0f} s")


async def realtime_turn(http, base: str, speech: np.ndarray, limit_s: float) -> dict:
    """One spoken turn over the Realtime WebSocket, the server's VAD committing it."""
    url = base.replace("http", "ws", 1) + f"/v1/realtime?model={MODEL}"
    audio, types, text = bytearray(), [], []
    first_audio = done = None
    async with http.ws_connect(url, heartbeat=30) as ws:
        chunk = REALTIME_RATE // 10 * 2  # 100 ms of pcm16
        data = pcm16(np.concatenate([to_24k(speech), np.zeros(REALTIME_RATE, np.float32)]))
        for start in range(0, len(data), chunk):
            piece = base64.b64encode(data[start : start + chunk]).decode()
            await ws.send_json({"type": "input_audio_buffer.append", "audio": piece})
        sent = time.monotonic()
        async with asyncio.timeout(limit_s):
            async for message in ws:
                event = json.loads(message.data)
                kind = event.get("type", "")
                types.append(kind)
                if kind in ("response.audio.delta", "response.output_audio.delta"):
                    first_audio = first_audio or time.monotonic()
                    audio += base64.b64decode(event["delta"])
                elif kind.endswith("transcript.delta") or kind.endswith("text.delta"):
                    text.append(event.get("delta", ""))
                elif kind == "error":
                    raise RuntimeError(f"error event: {event.get('error')}")
                elif kind == "response.done":
                    done = event["response"]
                    break
    return {
        "status": done.get("status") if done else None,
        "audio_seconds": len(audio) / 2 / REALTIME_RATE,
        "first_audio_ms_after_speech_sent": None if first_audio is None else round(1000 * (first_audio - sent)),
        "text": "".join(text)[:200],
        "event_types": sorted(set(types)),
        "ok": bool(done and done.get("status") in ("completed", "incomplete") and audio),  # (incomplete: cut by length)
    }


async def chat_turn(http, base: str, speech: np.ndarray) -> dict:
    body = {
        "model": MODEL,
        "modalities": ["text", "audio"],
        "audio": {"voice": "alloy", "format": "wav"},
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "input_audio",
                        "input_audio": {"data": base64.b64encode(wav_bytes(speech, 16000)).decode(), "format": "wav"},
                    }
                ],
            }
        ],
    }
    start = time.monotonic()
    async with http.post(f"{base}/v1/chat/completions", json=body) as response:
        answer = await response.json()
        status = response.status
    seconds = time.monotonic() - start
    message = (answer.get("choices") or [{}])[0].get("message", {}) if status == 200 else {}
    audio = base64.b64decode((message.get("audio") or {}).get("data", ""))
    return {
        "http_status": status,
        "seconds": round(seconds, 2),
        "audio_bytes": len(audio),
        "transcript": ((message.get("audio") or {}).get("transcript") or message.get("content") or "")[:200],
        "error": answer.get("error") if status != 200 else None,
        "ok": status == 200 and audio[:4] == b"RIFF",
    }


def notable(lines: list[str]) -> list[str]:
    """The server's lines worth reading: the device, the memory plans (each whole), warnings."""
    out, in_plan = [], False
    for line in lines:
        in_plan = "memory plan for" in line or (in_plan and line.startswith("  "))
        if in_plan or PLAN_LINE.search(line):
            out.append(line)
    return out[:120]


async def smoke(base: str, server: subprocess.Popen, args) -> dict:
    import aiohttp

    speech = speech_16k()
    report: dict = {}
    async with aiohttp.ClientSession() as http:
        report["ready_s"] = round(await wait_ready(http, base, server, args.ready_s), 1)
        for name, turn in (
            ("realtime", lambda: realtime_turn(http, base, speech, args.turn_s)),
            ("chat", lambda: chat_turn(http, base, speech)),
        ):
            try:
                report[name] = await turn()
            except Exception as exc:  # noqa: BLE001 - reported, the other turn still runs
                report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--expect-device", default="cuda", help="the device type serve must resolve (default cuda)")
    parser.add_argument("--ready-s", type=float, default=150.0, help="how long serve may take to be ready")
    parser.add_argument("--turn-s", type=float, default=60.0, help="how long the WebSocket turn may take")
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kimiaudio-smoke-") as tmp:
        log_path = Path(tmp) / "serve.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(log_path, "w") as log:
            # The default configuration: only the port is given (the data directory is the
            # working directory's data/, a scratch one here).
            server = subprocess.Popen(
                [sys.executable, "-m", "kimiaudio", "serve", "--port", str(port)],
                cwd=tmp,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # a step cut at its limit still stops serve
        try:
            report = asyncio.run(smoke(f"http://127.0.0.1:{port}", server, args))
        except Exception as exc:  # noqa: BLE001 - the report says what failed
            report = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        lines = log_path.read_text(errors="replace").splitlines()
    device = next((m[1] for m in map(DEVICE_LINE.match, lines) if m), None)
    report.update(
        serve_exit=server.returncode,
        device=device,
        server_lines=notable(lines),
        server_tail=[line for line in lines if not NOISE.match(line)][-30:],
    )
    on_device = device is not None and device.split(":")[0] == args.expect_device
    report["ok"] = bool(report.get("realtime", {}).get("ok") and report.get("chat", {}).get("ok") and on_device)
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
