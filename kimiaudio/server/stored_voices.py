"""The stored voices in the pipeline's registry: registered at start, kept in step with the
database that every instance on it shares.

The voices are rows of the store (store/voice_store.py); each instance registers them by name in
its pipeline (pipeline.voices) and keeps their DiT prefixes on its device. At start-up the
stored voices are registered (`registered_voices`, a cleanup context: after the store and the
pipeline have started), their prefixes computed on first use (the default voice's at once).
Instances sharing a database notice what another added or deleted (`voice_sync`): every
SYNC_INTERVAL_S an instance reads the stored names and creation times (no audio): a voice it
does not know, or knows with another creation time (deleted and added again), is loaded and
registered; one no longer stored is unregistered and its device copy dropped. The voices routes
sync before they answer, so a list fetched from any instance is current, and so does a request
naming a voice this instance lacks (the registry's `refresh`), so a voice added through one
instance can be used through another at once. On the SQLite file this process is the only
writer, so there is nothing to sync and nothing runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.voice_registry import STOCK_VOICES, Voice
from kimiaudio.server.context import SERVER_CONTEXT, ServerContext
from kimiaudio.store.voice_store import load_voices, voice_names

log = logging.getLogger(__name__)

SYNC_INTERVAL_S = 1.0  # one cheap query per second and instance


async def registered_voices(app: web.Application) -> AsyncIterator[None]:
    """Cleanup context: the stored voices registered in the pipeline (and the default voice's
    prefix made), before the server answers its first request."""
    context = app[SERVER_CONTEXT]
    pipeline, default = context.pipeline, context.config.voices.default
    if pipeline.can_speak:
        if context.store.is_shared:
            pipeline.voices.refresh = functools.partial(_refresh, context)
        for stored in await load_voices(context.store):
            pipeline.voices.add(Voice.create(stored.name, stored.pcm, stored.codes, stored.created_at))
        voice = pipeline.voices.resolve(default) if default and default in pipeline.voices else None
        if voice is not None:
            try:
                await pipeline.prepare_voice(voice)
            except KimiAudioError as exc:
                log.error("voices.default = %r cannot be used: %s", default, exc)
        for setting, name, answers in (
            ("voices.default", default, "answers that name no voice"),
            ("server.openai_voice", context.config.server.openai_voice, "answers that name an OpenAI voice (alloy...)"),
        ):
            if name and name not in STOCK_VOICES and name not in pipeline.voices:
                log.error(
                    "%s = %r is not a stored voice: %s will fail until it is added (POST /api/voices)",
                    setting,
                    name,
                    answers,
                )
    yield
    pipeline.voices.refresh = None  # (the store closes with this app)


async def sync_voices(context: ServerContext) -> None:
    """Register what another instance added, drop what it deleted (a shared database only)."""
    pipeline, store = context.pipeline, context.store
    if not pipeline.can_speak or not store.is_shared:
        return
    stored = await voice_names(store)
    known = {v.name: v.created_at for v in pipeline.voices.list()}
    for name, created_at in known.items():
        if stored.get(name) != created_at:  # deleted (maybe added again) through another instance
            removed = pipeline.voices.remove(name)
            if removed is not None:
                pipeline.forget_voice(removed)
    if any(known.get(name) != created_at for name, created_at in stored.items()):
        for row in await load_voices(store):
            if row.name not in pipeline.voices:
                pipeline.voices.add(Voice.create(row.name, row.pcm, row.codes, row.created_at))


async def _refresh(context: ServerContext) -> None:
    with contextlib.suppress(KimiAudioError):  # the database away: the name is refused as unknown
        await sync_voices(context)


async def voice_sync(app: web.Application) -> AsyncIterator[None]:
    """Cleanup context: the background sync, after the stored voices were registered."""
    context = app[SERVER_CONTEXT]
    if not context.store.is_shared:
        yield
        return
    task = asyncio.get_running_loop().create_task(_keep_in_sync(context))
    yield
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


async def _keep_in_sync(context: ServerContext) -> None:
    failing = False
    while True:
        await asyncio.sleep(SYNC_INTERVAL_S)
        try:
            await sync_voices(context)
            failing = False
        except Exception as exc:  # the database away: try again at the next tick
            if not failing:
                log.warning("cannot sync the voices with the database: %s", exc)
            failing = True
