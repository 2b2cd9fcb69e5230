"""Crash safety: `kill -9` of a real `serve` process while it answers; after a restart every
committed turn (with its audio) is there and the conversation continues from the store."""

import io
import math
import os
import signal
import time

import aiohttp
import numpy as np
import pytest
import soundfile as sf

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic

from helpers.audio import silence
from helpers.demo_server import heard_or_done
from helpers.serve_process import free_port, start_serve, stop_serve
from helpers.waiting import eventually

pytestmark = pytest.mark.slow


async def turns_stored(http, conversation_id: str, count: int) -> list[dict]:
    """The conversation's turns once there are `count` (an assistant turn is written as its answer ends)."""

    async def stored():
        turns = (await (await http.get(f"/api/conversations/{conversation_id}")).json())["turns"]
        return turns if len(turns) >= count else None

    return await eventually(stored, f"{count} turns stored")


async def test_kill_9_during_a_response_loses_no_committed_turn(tmp_path, speech):
    port = free_port()
    proc = start_serve(tmp_path, port)
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            mic = ScriptedMic()
            client = RtcClient(mic)
            status, _ = await client.connect(http)
            created = await client.wait_for("session.created")
            assert status == 201 and created["session"]["conversation_id"] is None  # created at the first commit
            mic.say(np.concatenate([speech[0], silence(1.0)]))
            committed = await client.wait_for("input_audio_buffer.committed")
            await client.wait_for("response.created")
            os.kill(proc.pid, signal.SIGKILL)  # mid-response: no shutdown, no database close
            proc.wait(10)
            await client.close()
    finally:
        if proc.poll() is None:
            proc.kill()

    conversation_id = committed["conversation_id"]
    port = free_port()
    proc = start_serve(tmp_path, port)
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            conversation = await (await http.get(f"/api/conversations/{conversation_id}")).json()
            turns = conversation["turns"]
            assert turns[0]["role"] == "user" and turns[0]["has_audio"], conversation
            wav = await (await http.get(f"/api/conversations/{conversation_id}/turns/0/audio")).read()
            pcm, rate = sf.read(io.BytesIO(wav), dtype="float32")
            assert rate == 16000 and pcm.size >= speech[0].size * 0.9  # the utterance incl. padding

            # Continue the same conversation: its history is re-encoded from the store.
            mic = ScriptedMic()
            client = RtcClient(mic)
            status, _ = await client.connect(http, conversation_id=conversation_id)
            created = await client.wait_for("session.created")
            assert status == 201 and created["session"]["conversation_id"] == conversation_id
            mic.say(np.concatenate([speech[1], silence(1.0)]))
            done = await client.wait_for("response.done")
            assert done["response"]["status"] in ("completed", "incomplete"), done
            await client.close()
            after = await turns_stored(http, conversation_id, len(turns) + 2)
            roles = [t["role"] for t in after]
            assert roles[: len(turns)] == [t["role"] for t in turns]
            assert roles[len(turns) :] == ["user", "assistant"], roles
            # The new prompt held the first utterance too: more prefill than the new turn alone.
            assert done["response"]["prefill_tokens_computed"] > 2 * len(after[-2]["audio_tokens"])
    finally:
        stop_serve(proc)


async def test_kill_9_while_an_answer_plays_keeps_what_was_heard(tmp_path, speech):
    from helpers.demo_server import LONG_ANSWER

    port = free_port()
    proc = start_serve(tmp_path, port)
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            mic = ScriptedMic()
            client = RtcClient(mic)
            await client.connect(http, session={"sampling": LONG_ANSWER})
            for attempt in range(1, 7):  # until an answer still playing has 9 codes (> 0.64 s) stored as heard
                spoke = time.monotonic()
                mic.say(np.concatenate([speech[0], silence(1.0)]))
                committed = await client.wait_for("input_audio_buffer.committed", count=attempt)
                if await heard_or_done(client, http, committed["conversation_id"], attempt, 9):
                    break
                await client.wait_for("response.done", count=attempt)
            else:
                raise AssertionError("no answer had 9 codes heard before it ended, in 6 attempts")
            os.kill(proc.pid, signal.SIGKILL)  # mid-answer: no shutdown, no final record
            killed = time.monotonic()
            proc.wait(10)
            conversation_id = client.of_type("input_audio_buffer.committed")[0]["conversation_id"]
            await client.close()
    finally:
        if proc.poll() is None:
            proc.kill()

    port = free_port()
    proc = start_serve(tmp_path, port)
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            turns = (await (await http.get(f"/api/conversations/{conversation_id}")).json())["turns"]
            assert [t["role"] for t in turns] == ["user", "assistant"] * attempt, turns
            heard = turns[-1]
            # Stored at its first audio and then every second: what was played (at least what was
            # seen stored before the kill; played in real time, so no more than the time since
            # the user began to speak, a bound a slow machine only loosens).
            assert heard["interrupted"] and heard["has_audio"], heard
            assert 0.64 < heard["duration_s"] <= killed - spoke, (heard["duration_s"], killed - spoke)
            wav = await (await http.get(f"/api/conversations/{conversation_id}/turns/{2 * attempt - 1}/audio")).read()
            pcm, rate = sf.read(io.BytesIO(wav), dtype="float32")
            assert rate == 24000 and pcm.size == round(heard["duration_s"] * rate) and np.abs(pcm).max() > 0.01
            # ... and the codes of that audio (1920 samples each: 4 mel frames of 480), for its history.
            assert len(heard["audio_tokens"] or []) == math.ceil(pcm.size / 1920), (heard["audio_tokens"], pcm.size)

            # The conversation goes on from the store, the interrupted answer in its history.
            mic = ScriptedMic()
            client = RtcClient(mic)
            await client.connect(http, conversation_id=conversation_id)
            mic.say(np.concatenate([speech[1], silence(1.0)]))
            done = await client.wait_for("response.done")
            assert done["response"]["status"] in ("completed", "incomplete", "cancelled"), done
            await client.close()
            after = await turns_stored(http, conversation_id, len(turns) + 2)
            assert [t["role"] for t in after] == ["user", "assistant"] * (attempt + 1)
            assert after[len(turns) - 1]["duration_s"] == heard["duration_s"]
    finally:
        stop_serve(proc)
