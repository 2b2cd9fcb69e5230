"""Voices shared by every instance on one database: each notices what another added or deleted.

The voices are rows of the store (store/voice_store.py); each instance registers them by name in
its pipeline (pipeline.voices) and keeps their DiT prefixes on its device. Every
SYNC_INTERVAL_S an instance reads the stored names and creation times (no audio): a voice it
does not know, or knows with another creation time (deleted and added again), is loaded and
registered; one no longer stored is unregistered and its device copy dropped. The voices routes
sync before they answer, so a list fetched from any instance is current. On the SQLite file
this process is the only writer, so there is nothing to sync and nothing runs.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from kimiaudio.pipeline.voices import Voice
from kimiaudio.server.app_keys import pipeline_key, store_key
from kimiaudio.store.voice_store import load_voices, voice_names

log = logging.getLogger(__name__)

SYNC_INTERVAL_S = 1.0  # one cheap query per second and instance


async def sync_voices(app: web.Application) -> None:
    pipeline, store = app[pipeline_key], app[store_key]
    if not pipeline.can_speak or not store.is_shared:
        return
    stored = await voice_names(store)
    known = {v.name: v.created_at for v in pipeline.voices.list()}
    for name, created_at in known.items():
        if stored.get(name) != created_at:  # deleted (maybe added again) through another instance
            voice = pipeline.voices.remove(name)
            if voice is not None:
                pipeline.forget_voice(voice)
    if any(known.get(name) != created_at for name, created_at in stored.items()):
        for voice in await load_voices(store):
            if voice.name not in pipeline.voices:
                pipeline.voices.add(Voice.create(voice.name, voice.pcm, voice.codes, voice.created_at))


async def voice_sync_context(app: web.Application):
    """The background sync, after the stored voices were registered (voice_routes.py)."""
    if not app[store_key].is_shared:
        yield
        return
    task = asyncio.get_running_loop().create_task(_keep_in_sync(app))
    yield
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


async def _keep_in_sync(app: web.Application) -> None:
    failing = False
    while True:
        await asyncio.sleep(SYNC_INTERVAL_S)
        try:
            await sync_voices(app)
            failing = False
        except Exception as exc:  # the database away: try again at the next tick
            if not failing:
                log.warning("cannot sync the voices with the database: %s", exc)
            failing = True
