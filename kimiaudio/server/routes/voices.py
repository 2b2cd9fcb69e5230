"""The voices API: list, add and delete the voices answers can be spoken in.

    GET    /api/voices          {"voices": [{name, seconds, num_codes, created_at}], "default", "stock"}
    POST   /api/voices          multipart/form-data: `name` and `file` (any audio PyAV reads,
                                voices.min_seconds..voices.max_seconds) -> 201 {name, ...}
    DELETE /api/voices/{name}

Adding a voice decodes the upload at 16 kHz (the GLM-4 tokenizer's codes) and 24 kHz (the
vocoder's mel), has the pipeline compute its codes and DiT prefix (kept on the device), then
stores its inputs (store/voice_store.py) and registers it by name (pipeline.voices), where
session.update `voice`, the OpenAI routes' `audio.voice` / `voice` and the page find it. At
start-up the stored voices are registered again, and instances sharing a database see each
other's voices (stored_voices.py). Errors are the API's JSON errors (api_error.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import numpy as np
from aiohttp import web

from kimiaudio.audio.io import DurationLimit, decode_audio_bytes, peak_level
from kimiaudio.audio.rates import SPEECH_INPUT_RATE, SPEECH_OUTPUT_RATE
from kimiaudio.audio.resampling import resample
from kimiaudio.config import Config
from kimiaudio.errors import AudioInputError, AudioTooLongError, KimiAudioError
from kimiaudio.pipeline.voice_registry import STOCK_VOICES, check_voice_name
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import server_context
from kimiaudio.server.inputs.multipart_form import read_form
from kimiaudio.server.stored_voices import sync_voices
from kimiaudio.store.voice_store import VoiceExistsError, delete_voice, save_voice

log = logging.getLogger(__name__)

MAX_NAME_BYTES = 256


routes = web.RouteTableDef()


@routes.get("/api/voices")
async def list_voices(request: web.Request) -> web.Response:
    context = server_context(request)
    await sync_voices(context)
    pipeline = context.pipeline
    return web.json_response(
        {
            "voices": [v.describe() for v in pipeline.voices.list()],
            "default": context.config.voices.default or None,
            "stock": sorted(STOCK_VOICES),
        }
    )


@routes.post("/api/voices")
async def add_voice(request: web.Request) -> web.Response:
    context = server_context(request)
    pipeline, config = context.pipeline, context.config
    if not pipeline.can_speak:
        raise ApiError(400, "text_only", "this server answers in text only (model.text_only = true): no voices")
    name, data = await _read_upload(request)
    try:
        check_voice_name(name)
    except KimiAudioError as exc:
        raise ApiError(400, "invalid_name", str(exc)) from None
    await sync_voices(context)
    if name in pipeline.voices:
        raise ApiError(409, "voice_exists", f"a voice named {name!r} exists already (delete it first)")
    try:
        pcm24, pcm16 = await asyncio.get_running_loop().run_in_executor(None, _decode, data, config.voices.max_seconds)
    except AudioInputError as exc:
        raise ApiError(400, "too_long" if isinstance(exc, AudioTooLongError) else "undecodable", str(exc)) from None
    _check_reference(pcm24, config)
    try:
        voice = await pipeline.make_voice(name, pcm16, pcm24)
    except KimiAudioError as exc:
        raise ApiError(400, "unusable_voice", f"this recording cannot be a voice: {exc}") from None
    try:
        stored = await save_voice(context.store, name, voice.wav24k, SPEECH_OUTPUT_RATE, list(voice.codes))
    except VoiceExistsError as exc:
        raise ApiError(409, "voice_exists", str(exc)) from None
    voice = dataclasses.replace(voice, created_at=stored.created_at)  # the same inputs: the same key
    pipeline.voices.add(voice)
    return web.json_response(voice.describe(), status=201)


@routes.delete("/api/voices/{name}")
async def remove_voice(request: web.Request) -> web.Response:
    context = server_context(request)
    pipeline, name = context.pipeline, request.match_info["name"]
    await sync_voices(context)
    if name not in pipeline.voices:
        raise ApiError(404, "not_found", f"no voice named {name[:MAX_NAME_BYTES]!r}")
    # A voice the config names would fail every answer that comes to it (as the start warns).
    for setting, configured, what in (
        ("voices.default", context.config.voices.default, "the default voice"),
        ("server.openai_voice", context.config.server.openai_voice, "the voice OpenAI's voice names speak in"),
    ):
        if name == configured:
            raise ApiError(409, "default_voice", f"{name!r} is {what} ({setting}): change the config first")
    deleted = await delete_voice(context.store, name)
    voice = pipeline.voices.remove(name)
    if voice is not None:  # (a concurrent delete may have taken it meanwhile)
        pipeline.forget_voice(voice)
    if not deleted:  # a concurrent delete took it first
        raise ApiError(404, "not_found", f"no voice named {name[:MAX_NAME_BYTES]!r}")
    return web.json_response({"deleted": name})


async def _read_upload(request: web.Request) -> tuple[str, bytes]:
    """The `name` and `file` fields of the form."""
    fields = await read_form(
        request,
        {"name": MAX_NAME_BYTES, "file": server_context(request).config.server.max_body_bytes},
        ("name", "file"),
        "fields `name` and `file` (an audio file)",
    )
    return fields["name"].text().strip(), fields["file"].data


def _decode(data: bytes, max_seconds: float) -> tuple[np.ndarray, np.ndarray]:
    """The upload at the vocoder's rate (the mel) and at the tokenizer's (the codes): decoded once."""
    pcm24 = decode_audio_bytes(data, SPEECH_OUTPUT_RATE, "file", DurationLimit(max_seconds, "voices.max_seconds"))
    return pcm24, resample(pcm24, SPEECH_OUTPUT_RATE, SPEECH_INPUT_RATE)


def _check_reference(pcm: np.ndarray, config: Config) -> None:
    seconds = pcm.size / SPEECH_OUTPUT_RATE
    limits = config.voices
    if seconds < limits.min_seconds:
        raise ApiError(
            400,
            "too_short",
            f"the recording is {seconds:.2f} s long; a voice needs at least "
            f"{limits.min_seconds:g} s (voices.min_seconds)",
        )
    if seconds > limits.max_seconds:
        raise ApiError(
            400,
            "too_long",
            f"the recording is {seconds:.2f} s long; a voice takes at most "
            f"{limits.max_seconds:g} s (voices.max_seconds)",
        )
    try:
        peak = peak_level(pcm)
    except AudioInputError as exc:
        raise ApiError(400, "undecodable", str(exc)) from None
    if peak < config.audio.silence_peak:
        raise ApiError(
            400,
            "silent",
            f"the recording is silent (peak {peak:.2g} is below audio.silence_peak = {config.audio.silence_peak:g})",
        )
