"""The server app with the real pipeline on the demo checkpoint, as the server tests run it
(the `demo_server` fixture in conftest.py opens it): its settings, its model stack (loaded
once per test session), a pipeline that records what the server asked of it, and waits on
what the server stores. The WebRTC test client is package code (kimiaudio.bench.loopback_client,
also used by bench --webrtc)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from pathlib import Path

from kimiaudio.config import Config
from kimiaudio.engine.request import BACKGROUND_PRIORITY
from kimiaudio.pipeline.pipeline import Pipeline

from helpers.waiting import eventually

# ------------------------------------------------------------- the real server on the demo checkpoint


DEMO_MAX_NEW_TOKENS = 60  # about 2 s of (noise) speech from the demo weights
# Sampling for a long answer from the demo weights: with greedy audio, most answers run for
# 4-10 s (up to 400 positions), generated in a second or two and played in real time; but
# some still stop within a second, depending on the captured user audio (under load the
# WebRTC input drops frames, so it differs more). Tests that need a response still in progress
# also set RecordingPipeline.answers_to_limit (see long_answer_playing in test_server_rtc.py).
LONG_ANSWER = {"audio_top_k": 1, "max_new_tokens": 400}


def demo_config(checkpoint: Path, data_dir: Path, **server) -> Config:
    config = Config()
    config.model.path = str(checkpoint)
    config.model.device = "cpu"
    config.storage.data_dir = str(data_dir)
    config.engine.num_kv_blocks = 256
    config.sampling.max_new_tokens = DEMO_MAX_NEW_TOKENS
    config.vad.silence_ms = 400
    for key, value in server.items():
        setattr(config.server, key, value)
    return config


@functools.cache
def demo_stack(checkpoint: Path):
    """The model stack of the demo checkpoint, loaded once per test session (it is only read)."""
    from kimiaudio.pipeline.model_stack import ModelStack

    return ModelStack.load(demo_config(checkpoint, checkpoint.parent / "unused"))


class RecordingPipeline(Pipeline):
    """The real pipeline, also keeping what the server asked of it: the answers' turn requests
    and their handles, the transcriptions' (background priority) apart, and the turn ids it
    was told to cancel."""

    def __init__(self, stack, config):
        super().__init__(stack, config)
        self.requests, self.handles, self.cancelled = [], [], []
        self.transcriptions = []  # (request, handle) of each user turn transcribed
        # Answers ignore the end of message and run to their max_new_tokens: a test that must
        # interrupt an answer in progress gets a long one whatever the random weights say.
        self.answers_to_limit = False

    def submit(self, request):
        if self.answers_to_limit and request.priority != BACKGROUND_PRIORITY:
            request = dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, ignore_eos=True))
        handle = super().submit(request)
        if request.priority == BACKGROUND_PRIORITY:
            self.transcriptions.append((request, handle))
        else:
            self.requests.append(request)
            self.handles.append(handle)
        return handle

    def cancel(self, handle):
        self.cancelled.append(handle.turn_id)
        super().cancel(handle)


@contextlib.asynccontextmanager
async def open_demo_server(aiohttp_client, checkpoint: Path, data_dir: Path, storage_url: str = "", **server):
    """(test client, pipeline): the server app with a real pipeline on the demo checkpoint (its
    conversations in a SQLite file under `data_dir`, or the PostgreSQL database `storage_url`)."""
    from kimiaudio.server.app import create_app

    config = demo_config(checkpoint, data_dir, **server)
    config.storage.url = storage_url
    stack = demo_stack(checkpoint)
    pipeline = RecordingPipeline(stack, config)
    await pipeline.start()
    try:
        http = await aiohttp_client(create_app(config, stack, pipeline))
        yield http, pipeline
        await http.close()
    finally:
        await pipeline.stop()


async def kv_pool_full_again(pipeline) -> dict:
    """Wait until no turn runs and every KV block is free again."""

    async def settled():
        stats = pipeline.stats()
        idle = stats["kv_blocks_free"] == stats["kv_blocks_total"] and stats["running"] == 0 and stats["turns"] == 0
        return stats if idle else None

    try:
        return await eventually(settled, "KV pool released")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {pipeline.stats()}") from None


async def heard_or_done(client, http, conversation_id: str, attempt: int, codes: int) -> bool:
    """Wait until the answer to user turn `attempt` (1-based) has `codes` audio codes stored as
    heard (the server stores a playing answer's heard part, and the codes of it, every second)
    -> True; or its response.done came first -> False. Not a wall-clock wait: on a loaded
    machine the answer may play behind time, and what was heard is read back from the store."""
    index = 2 * attempt - 1

    async def check():
        if len(client.of_type("response.done")) >= attempt:
            return "done"
        turns = (await (await http.get(f"/api/conversations/{conversation_id}")).json())["turns"]
        return "heard" if len(turns) > index and len(turns[index]["audio_tokens"] or []) >= codes else None

    return await eventually(check, f"answer {attempt} heard for {codes} codes, or done", interval=0.1) == "heard"


# ------------------------------------------------------------- a real `serve` process


# ------------------------------------------------------------- hostile clients


async def lease_free(store, conversation_id: str) -> bool:
    """No session holds `conversation_id` (a SQLite store): its call's close has let it go."""

    def held(db):
        return db.execute("SELECT 1 FROM leases WHERE conversation_id = ?", [conversation_id]).fetchone()

    return await store.read(held) is None
