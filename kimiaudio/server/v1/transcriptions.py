"""POST /v1/audio/transcriptions: speech to text with the official ASR prompt.

Multipart form as OpenAI's: `file` (any container PyAV reads, at most server.max_body_bytes),
`model`, optional `response_format` (json | text | verbose_json | srt | vtt), `stream`
(server-sent transcript.text.delta events, then transcript.text.done), `language`, `prompt`
and `temperature`. The turn is the official ASR example's (a user text message holding
ASR_INSTRUCTION, then the audio), generated as text only: no detokenizer work. `prompt` and
`language` are accepted and not used (the official prompt is fixed; the model detects the
language); srt/vtt hold one cue spanning the whole audio, as no word timestamps exist.
"""

from __future__ import annotations

import math

from aiohttp import web

from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.pipeline.events import TextDelta, TurnDone
from kimiaudio.pipeline.turn_request import HistoryTurn, TurnRequest
from kimiaudio.text.prompt import ASR_INSTRUCTION
from kimiaudio.server.app_keys import config_key, max_body_bytes_key, pipeline_key
from kimiaudio.server.inputs.multipart_form import MAX_TEXT_BYTES, read_form
from kimiaudio.server.v1 import sse
from kimiaudio.server.v1.audio_input import speech_from_bytes
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.v1.models import check_model
from kimiaudio.server.v1.turn_guard import guarded_turn

RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
TEXT_FIELDS = ("model", "response_format", "stream", "language", "prompt", "temperature")


async def _form(request: web.Request) -> dict:
    """The form's text fields by name, and `file`: (its file name, its bytes)."""
    limits = {name: MAX_TEXT_BYTES for name in TEXT_FIELDS} | {"file": request.app[max_body_bytes_key]}
    form = await read_form(request, limits, ("file",), "the audio as `file`")
    fields = {name: field.text() for name, field in form.items() if name != "file"}
    fields["file"] = (form["file"].filename or "file", form["file"].data)
    return fields


def _flag(value: str | None, param: str) -> bool:
    if value in (None, "", "false", "False", "0"):
        return False
    if value in ("true", "True", "1"):
        return True
    raise ApiError(400, "invalid_value", f"{param}: expected true or false", param=param)


async def transcriptions(request: web.Request) -> web.StreamResponse:
    config, pipeline = request.app[config_key], request.app[pipeline_key]
    fields = await _form(request)
    check_model(fields.get("model"))
    response_format = fields.get("response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise ApiError(400, "invalid_value", f"response_format: expected one of {', '.join(RESPONSE_FORMATS)}",
                       param="response_format")
    stream = _flag(fields.get("stream"), "stream")
    name, data = fields["file"]
    pcm = speech_from_bytes(data, None, config.audio, "file", name)
    turn = TurnRequest(conversation_id="transcription", history=[HistoryTurn("user", text=ASR_INSTRUCTION)],
                       user_audio=pcm, sampling=SamplingParams.from_config(config.sampling), output_type="text")
    seconds = pcm.size / SPEECH_INPUT_RATE
    async with guarded_turn(request, pipeline, turn) as handle:
        if stream:
            return await _stream(request, handle)
        done = await _last(handle)
    if done.status != "completed":
        raise ApiError(500, "transcription_failed", f"the transcription failed ({done.error or done.status})")
    return _formatted(done.text.strip(), response_format, seconds, fields.get("language"))


async def _last(handle) -> TurnDone:
    async for event in handle:
        if isinstance(event, TurnDone):
            return event
    raise ApiError(500, "internal_error", "the turn ended without a result")


async def _stream(request: web.Request, handle) -> web.StreamResponse:
    response = await sse.open_stream(request)
    text = ""
    async for event in handle:
        if isinstance(event, TextDelta) and event.text:
            text += event.text
            await sse.send(response, {"type": "transcript.text.delta", "delta": event.text})
        elif isinstance(event, TurnDone):
            if event.status != "completed":  # the status line is sent already: say it in the stream
                await sse.send_error(response, ApiError(500, "transcription_failed",
                                                        f"the transcription failed ({event.error or event.status})"))
            else:
                await sse.send(response, {"type": "transcript.text.done", "text": text.strip()})
    await sse.send_done(response)
    return response


def _timestamp(seconds: float, separator: str) -> str:
    ms = int(round(seconds * 1000))
    return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}{separator}{ms % 1000:03d}"


def _formatted(text: str, response_format: str, seconds: float, language: str | None) -> web.Response:
    usage = {"type": "duration", "seconds": math.ceil(seconds)}
    if response_format == "json":
        return web.json_response({"text": text, "usage": usage})
    if response_format == "text":
        return web.Response(text=text, content_type="text/plain")
    if response_format == "verbose_json":
        segment = {"id": 0, "seek": 0, "start": 0.0, "end": round(seconds, 3), "text": text, "tokens": [],
                   "temperature": 0.0, "avg_logprob": 0.0, "compression_ratio": 1.0, "no_speech_prob": 0.0}
        return web.json_response({"task": "transcribe", "language": language or "unknown",
                                  "duration": round(seconds, 3), "text": text, "segments": [segment], "usage": usage})
    if response_format == "srt":
        return web.Response(text=f"1\n{_timestamp(0, ',')} --> {_timestamp(seconds, ',')}\n{text}\n\n",
                            content_type="application/x-subrip")
    return web.Response(text=f"WEBVTT\n\n{_timestamp(0, '.')} --> {_timestamp(seconds, '.')}\n{text}\n\n",
                        content_type="text/vtt")
