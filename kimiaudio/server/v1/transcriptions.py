"""POST /v1/audio/transcriptions: speech to text with the official ASR prompt.

Multipart form as OpenAI's: `file` (any container PyAV reads, at most server.max_body_bytes),
`model`, optional `response_format` (json | text | verbose_json | srt | vtt), `stream`
(server-sent transcript.text.delta events, then transcript.text.done), `language` (a Whisper
code: it picks the official instruction, text/asr_instruction.py, and verbose_json reports
it; "undetermined" when it names none: the model does not say what it heard), `prompt`
(prior text: a user text message before the instruction), `temperature` (0..1, of the text
stream), `include[]=logprobs` (json and streams: each token's log-probability) and
`timestamp_granularities[]=segment` (verbose_json). The turn is the official ASR example's
(the instruction as a user text message, then the audio), generated as text only: no
detokenizer work. Audio with nothing said (its peak under audio.silence_peak) is answered
with an empty transcript without running the model, as OpenAI answers it, where a spoken turn
refuses it. verbose_json's segment holds measured values only: the generated text tokens,
their mean log-probability (0.0 when there are none), the text's compression ratio (as Whisper
computes it), the temperature used and no_speech_prob (1 - the silero VAD's highest speech
probability over the audio); the answer's shapes: transcription_output.py. `word` granularity
is refused (no word timestamps exist). Fields the model cannot honour are refused
(inputs/openai_params.py).
"""

from __future__ import annotations

import asyncio
from functools import cache
from typing import Any

from aiohttp import web

from kimiaudio.audio.io import is_silent
from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.audio.vad import SileroVad
from kimiaudio.config import check_setting
from kimiaudio.engine.request import ANSWER_PRIORITY
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.events import TextDelta, TurnDone
from kimiaudio.pipeline.transcription import transcription_request
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import server_context
from kimiaudio.server.inputs.audio_input import decoded_speech
from kimiaudio.server.inputs.multipart_form import MAX_TEXT_BYTES, read_form
from kimiaudio.server.inputs.openai_params import TRANSCRIPTION_FIELDS, TranscriptionSampling, check_model, checked
from kimiaudio.server.observe.request_log import CLIENT_CLOSED, request_record
from kimiaudio.server.token_logprobs import token_logprobs
from kimiaudio.server.v1.openai_output import open_stream, send_done, send_error, send_event
from kimiaudio.server.v1.transcription_output import formatted, segment, stream_usage, verbose
from kimiaudio.server.v1.turn_guard import client_gone, failed_turn_error, guarded_turn, once_started
from kimiaudio.text.asr_instruction import check_language

RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
LIST_FIELDS = ("timestamp_granularities[]", "include[]", "known_speaker_names[]", "known_speaker_references[]")
TEXT_FIELDS = (
    "model",
    "response_format",
    "stream",
    "language",
    "prompt",
    "temperature",
    "chunking_strategy",
    *LIST_FIELDS,
)


async def _form(request: web.Request) -> tuple[dict[str, Any], tuple[str, bytes]]:
    """(The form's text fields by name (a list field: its values), `file`: (its file name, its
    bytes)). A field OpenAI's API does not have is refused."""
    max_file_bytes = server_context(request).config.server.max_body_bytes
    limits = {name: MAX_TEXT_BYTES for name in TEXT_FIELDS} | {"file": max_file_bytes}
    unknown: list[str] = []
    form = await read_form(request, limits, ("file",), "the audio as `file`", LIST_FIELDS, unknown)
    fields: dict[str, Any] = {
        name: (field.texts() if name in LIST_FIELDS else field.text()) for name, field in form.items() if name != "file"
    }
    # An object field arrives as `name[key]` parts (chunking_strategy[type]): judged by its name.
    names = [name.partition("[")[0] if "[" in name and not name.endswith("[]") else name for name in unknown]
    TRANSCRIPTION_FIELDS.check({**{name: {"object": name} for name in names}, **fields})
    return fields, (form["file"].filename or "file", form["file"].data)


def _flag(value: str | None, param: str) -> bool:
    if value in (None, "", "false", "False", "0"):
        return False
    if value in ("true", "True", "1"):
        return True
    raise ApiError(400, "invalid_value", f"{param}: expected true or false", param=param)


def _temperature(value: str | None, config) -> float:
    """The text stream's temperature: the form's (0..1, as OpenAI's), else the configured one."""
    if not value:
        return config.sampling.text_temperature
    try:
        number = float(value)
    except ValueError:
        raise ApiError(
            400, "invalid_value", f"temperature: expected a number in [0, 1], got {value[:40]!r}", param="temperature"
        ) from None
    return checked(TranscriptionSampling, {"temperature": number})["temperature"]


def _options(fields: dict, response_format: str) -> tuple[bool, bool]:
    """(segment timestamps asked for, logprobs asked for), refusing what cannot be given."""
    granularities = fields.get("timestamp_granularities[]") or []
    if set(granularities) - {"segment"}:
        raise ApiError(
            400,
            "unsupported_parameter",
            'timestamp_granularities: only "segment" is supported (the model gives no word timestamps)',
            param="timestamp_granularities",
        )
    if granularities and response_format != "verbose_json":
        raise ApiError(
            400,
            "invalid_value",
            "timestamp_granularities: needs response_format verbose_json",
            param="timestamp_granularities",
        )
    include = fields.get("include[]") or []
    if set(include) - {"logprobs"}:
        raise ApiError(400, "invalid_value", 'include: expected ["logprobs"]', param="include")
    if include and response_format != "json" and not _flag(fields.get("stream"), "stream"):
        raise ApiError(
            400, "invalid_value", "include: logprobs come with response_format json (or a stream)", param="include"
        )
    return bool(granularities), bool(include)


async def transcriptions(request: web.Request) -> web.StreamResponse:
    context = server_context(request)
    config, pipeline = context.config, context.pipeline
    fields, (name, data) = await _form(request)
    check_model(fields.get("model"), config.server.model_aliases)
    response_format = fields.get("response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise ApiError(
            400,
            "invalid_value",
            f"response_format: expected one of {', '.join(RESPONSE_FORMATS)}",
            param="response_format",
        )
    stream = _flag(fields.get("stream"), "stream")
    _, with_logprobs = _options(fields, response_format)
    language = None
    if fields.get("language"):
        try:
            language = check_language(fields["language"])
        except KimiAudioError as exc:
            raise ApiError(400, "invalid_value", str(exc), param="language") from None
    temperature = check_setting("sampling", "text_temperature", _temperature(fields.get("temperature"), config))
    pcm = await decoded_speech(data, None, config.audio, "file", name, silence_ok=True)
    seconds = pcm.size / SPEECH_INPUT_RATE
    request_record(request).audio_in_s = seconds
    if is_silent(pcm, config.audio):
        return await _nothing_said(request, response_format, stream, seconds, language, with_logprobs)
    sampling = SamplingParams.from_config(config.sampling, text_temperature=temperature)
    turn = transcription_request(
        "transcription",
        pcm,
        sampling,
        language=language,
        prompt=fields.get("prompt") or "",
        priority=ANSWER_PRIORITY,
        logprobs=True,
    )  # a client waits for it
    speech: asyncio.Future[float] | None = None
    if response_format == "verbose_json" and not stream:  # the VAD runs while the model transcribes
        speech = asyncio.get_running_loop().run_in_executor(context.vad_executor, _max_speech_probability, pcm)
    try:
        async with guarded_turn(request, pipeline, turn) as handle:
            if stream:
                return await _stream(request, handle, with_logprobs)
            done = await handle.result()
        if done is None or done.status != "completed":
            raise failed_turn_error(request, done, "transcription_failed", "the transcription", "prompt")
        text = done.text.strip()
        if speech is not None:  # verbose_json
            segments = [segment(text, done, seconds, temperature, await speech)]
            return web.json_response(verbose(text, seconds, language, segments))
        return formatted(text, response_format, seconds, done.logprobs if with_logprobs else None)
    finally:
        if speech is not None and not speech.done():  # the turn failed: its VAD pass is not wanted
            speech.cancel()


@cache
def _shared_vad() -> SileroVad:
    return SileroVad()  # made and used on the one VAD thread only


def _max_speech_probability(pcm) -> float:
    return _shared_vad().max_speech_probability(pcm)


async def _stream(request: web.Request, handle, with_logprobs: bool) -> web.StreamResponse:
    events = await once_started(request, handle, "transcription_failed", "the transcription", "prompt")
    response = await open_stream(request)
    text, logprobs = "", []
    try:
        async for event in events:
            if client_gone(request):
                request_record(request).cancelled = CLIENT_CLOSED
                return response  # the guard cancels the turn
            if isinstance(event, TextDelta) and event.text:
                request_record(request).first_byte()
                text += event.text
                extra = {"logprobs": token_logprobs(event.logprobs)} if with_logprobs else {}
                logprobs += extra.get("logprobs", [])
                await send_event(response, {"type": "transcript.text.delta", "delta": event.text, **extra})
            elif isinstance(event, TurnDone):
                if event.status != "completed":  # the status line is sent already: say it in the stream
                    error = failed_turn_error(request, event, "transcription_failed", "the transcription", "prompt")
                    await send_error(request, response, error)
                else:
                    extra = {"logprobs": logprobs} if with_logprobs else {}
                    await send_event(response, _done_event(text.strip(), extra, event))
        await send_done(response)
    except ConnectionResetError:  # the client went away between two writes: its 200 was sent
        request_record(request).cancelled = CLIENT_CLOSED
    return response


async def _nothing_said(
    request: web.Request, response_format: str, stream: bool, seconds: float, language: str | None, logprobs: bool
) -> web.StreamResponse:
    """The empty transcript of audio with nothing said, in the form asked for."""
    if stream:
        response = await open_stream(request)
        await send_event(response, _done_event("", {"logprobs": []} if logprobs else {}, None))
        await send_done(response)
        return response
    if response_format == "verbose_json":
        return web.json_response(verbose("", seconds, language, []))
    return formatted("", response_format, seconds, [] if logprobs else None)


def _done_event(text: str, extra: dict, done: TurnDone | None) -> dict:
    return {"type": "transcript.text.done", "text": text, **extra, "usage": stream_usage(done)}
