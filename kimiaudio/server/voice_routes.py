"""The voices API: list, add and delete the voices answers can be spoken in.

    GET    /api/voices          {"voices": [{name, seconds, num_codes, created_at}], "default", "stock"}
    POST   /api/voices          multipart/form-data: `name` and `file` (any audio PyAV reads,
                                voices.min_seconds..voices.max_seconds) -> 201 {name, ...}
    DELETE /api/voices/{name}

Adding a voice decodes the upload at 16 kHz (the GLM-4 tokenizer's codes) and 24 kHz (the
vocoder's mel), has the pipeline compute its codes and DiT prefix (kept on the device), then
stores its inputs (store/voice_store.py) and registers it by name (pipeline.voices), where
session.update `voice`, the OpenAI routes' `audio.voice` / `voice` and the page find it. At
start-up the stored voices are registered again; their prefixes are computed on first use
(the default voice's at once). Instances sharing a database see each other's voices
(voice_sync.py). Errors are the API's JSON errors (api_error.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import numpy as np
from aiohttp import web

from kimiaudio.audio.io import decode_audio_bytes, resample
from kimiaudio.audio.rates import SPEECH_INPUT_RATE, SPEECH_OUTPUT_RATE
from kimiaudio.errors import AudioInputError, KimiAudioError
from kimiaudio.pipeline.voices import STOCK_VOICES, Voice, check_voice_name
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.app_keys import config_key, max_body_bytes_key, pipeline_key, store_key
from kimiaudio.server.inputs.multipart_form import read_form
from kimiaudio.server.voice_sync import sync_voices, voice_sync_context
from kimiaudio.store.voice_store import VoiceExistsError, delete_voice, load_voices, save_voice

log = logging.getLogger(__name__)

MAX_NAME_BYTES = 256


def setup_voice_routes(app: web.Application) -> None:
    app.router.add_get("/api/voices", list_voices)
    app.router.add_post("/api/voices", add_voice)
    app.router.add_delete("/api/voices/{name}", remove_voice)
    app.cleanup_ctx.append(_register_stored_voices)
    app.cleanup_ctx.append(voice_sync_context)


async def _register_stored_voices(app: web.Application):
    """Runs after the store and pipeline contexts (appended after them)."""
    pipeline, default = app[pipeline_key], app[config_key].voices.default
    if pipeline.can_speak:
        for stored in await load_voices(app[store_key]):
            pipeline.voices.add(Voice.create(stored.name, stored.pcm, stored.codes, stored.created_at))
        if default and default in pipeline.voices:
            try:
                await pipeline.prepare_voice(pipeline.voices.resolve(default))
            except KimiAudioError as exc:
                log.error("voices.default = %r cannot be used: %s", default, exc)
        elif default and default not in STOCK_VOICES:
            log.error(
                "voices.default = %r is not a stored voice: answers that name no voice will fail "
                "until it is added (POST /api/voices)",
                default,
            )
    yield


async def list_voices(request: web.Request) -> web.Response:
    await sync_voices(request.app)
    pipeline = request.app[pipeline_key]
    return web.json_response(
        {
            "voices": [v.describe() for v in pipeline.voices.list()],
            "default": request.app[config_key].voices.default or None,
            "stock": sorted(STOCK_VOICES),
        }
    )


async def add_voice(request: web.Request) -> web.Response:
    app = request.app
    pipeline, cfg = app[pipeline_key], app[config_key]
    if not pipeline.can_speak:
        raise ApiError(400, "text_only", "this server answers in text only (model.text_only = true): no voices")
    name, data = await _read_upload(request)
    try:
        check_voice_name(name)
    except KimiAudioError as exc:
        raise ApiError(400, "invalid_name", str(exc)) from None
    await sync_voices(app)
    if name in pipeline.voices:
        raise ApiError(409, "voice_exists", f"a voice named {name!r} exists already (delete it first)")
    try:
        pcm24, pcm16 = await asyncio.get_running_loop().run_in_executor(None, _decode, data)
    except AudioInputError as exc:
        raise ApiError(400, "undecodable", str(exc)) from None
    _check_reference(pcm24, cfg)
    try:
        voice = await pipeline.make_voice(name, pcm16, pcm24)
    except KimiAudioError as exc:
        raise ApiError(400, "unusable_voice", f"this recording cannot be a voice: {exc}") from None
    try:
        stored = await save_voice(app[store_key], name, voice.wav24k, SPEECH_OUTPUT_RATE, list(voice.codes))
    except VoiceExistsError as exc:
        raise ApiError(409, "voice_exists", str(exc)) from None
    voice = dataclasses.replace(voice, created_at=stored.created_at)  # the same inputs: the same key
    pipeline.voices.add(voice)
    return web.json_response(voice.describe(), status=201)


async def remove_voice(request: web.Request) -> web.Response:
    app = request.app
    pipeline, name = app[pipeline_key], request.match_info["name"]
    await sync_voices(app)
    if name not in pipeline.voices:
        raise ApiError(404, "not_found", f"no voice named {name!r}")
    if name == app[config_key].voices.default:
        raise ApiError(409, "default_voice", f"{name!r} is the default voice (voices.default): change the config first")
    await delete_voice(app[store_key], name)
    voice = pipeline.voices.remove(name)
    if voice is not None:  # (a concurrent delete may have taken it meanwhile)
        pipeline.forget_voice(voice)
    return web.json_response({"deleted": name})


async def _read_upload(request: web.Request) -> tuple[str, bytes]:
    """The `name` and `file` fields of the form."""
    fields = await read_form(
        request,
        {"name": MAX_NAME_BYTES, "file": request.app[max_body_bytes_key]},
        ("name", "file"),
        "fields `name` and `file` (an audio file)",
    )
    return fields["name"].text().strip(), fields["file"].data


def _decode(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The upload at the vocoder's rate (the mel) and at the tokenizer's (the codes): decoded once."""
    pcm24 = decode_audio_bytes(data, SPEECH_OUTPUT_RATE, "file")
    return pcm24, resample(pcm24, SPEECH_OUTPUT_RATE, SPEECH_INPUT_RATE)


def _check_reference(pcm: np.ndarray, cfg) -> None:
    seconds = pcm.size / SPEECH_OUTPUT_RATE
    limits = cfg.voices
    if pcm.size and not np.all(np.isfinite(pcm)):
        raise ApiError(400, "undecodable", "the audio holds NaN or infinite samples")
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
    peak = float(np.max(np.abs(pcm)))
    if peak < cfg.audio.silence_peak:
        raise ApiError(
            400,
            "silent",
            f"the recording is silent (peak {peak:.2g} is below audio.silence_peak = {cfg.audio.silence_peak:g})",
        )
