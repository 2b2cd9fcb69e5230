"""Graceful shutdown of a real `python -m kimiaudio serve` (demo checkpoint) by SIGTERM while it
answers: new offers are refused at once (503), the answer in flight is let finish within
server.shutdown_grace_s (or cut there, keeping what was heard, its response.done saying the
server cut it), the session's last event is an `error` `shutting_down`, the process exits 0 and
the stored conversation has the user turn and the assistant turn with the audio that was
played."""

import asyncio
import contextlib
import signal
import subprocess
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.store import ConversationStore

from helpers.audio import silence
from helpers.demo_server import LONG_ANSWER, heard_or_done
from helpers.serve_process import free_port, start_serve
from helpers.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def start_with_grace(tmp_path: Path, grace_s: float) -> tuple[subprocess.Popen, int, list[str]]:
    """`serve` with long demo answers and the given grace; (process, port, its output lines)."""
    port = free_port()
    proc = start_serve(
        tmp_path,
        port,
        f"[server]\nshutdown_grace_s = {grace_s}\n"
        f"[sampling]\naudio_top_k = {LONG_ANSWER['audio_top_k']}\n"
        f"max_new_tokens = {LONG_ANSWER['max_new_tokens']}\n"
        "[engine]\nnum_kv_blocks = 256\n[vad]\nsilence_ms = 400\n",
    )
    return proc, port, proc.output_lines


async def answer_then_sigterm(proc, port, speech) -> tuple[dict, dict, int | None, list[dict]]:
    """Speak until an answer still playing has 5 codes (> 0.32 s) stored as heard (the demo
    weights sometimes stop within a second), SIGTERM then; (committed event, its response.done
    or {}, status of an offer made once /readyz says the server drains; None if it was gone,
    the error events after the SIGTERM)."""
    async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
        client = RtcClient(ScriptedMic())
        assert (await client.connect(http))[0] == 201
        for attempt in range(1, 6):
            client.mic.say(np.concatenate([speech[0], silence(1.0)]))
            committed = await client.wait_for("input_audio_buffer.committed", count=attempt)
            if await heard_or_done(client, http, committed["conversation_id"], attempt, 5):
                break
            await client.wait_for("response.done", count=attempt)
        else:
            raise AssertionError("no answer had 5 codes heard before it ended, in 5 attempts")
        errors_before = len(client.of_type("error"))
        proc.send_signal(signal.SIGTERM)
        late = await offer_while_draining(http)
        try:
            done = await client.wait_for("response.done", count=attempt, timeout=120)
        except AssertionError:
            done = {}
        with contextlib.suppress(AssertionError):  # (the last event, once the grace has ended)
            await client.wait_for("error", count=errors_before + 1, timeout=120)
        await client.close()
    return committed, done, late, client.of_type("error")[errors_before:]


async def offer_while_draining(http) -> int | None:
    """The status of an offer made once /readyz says the server stopped admitting (after the
    SIGTERM); None if the server was gone before (a short grace can end first)."""

    async def draining():
        try:
            ready = await http.get("/readyz")
            if ready.status != 503:
                return None
            assert (await ready.json())["problems"] == ["shutting down"]  # (the pipeline still runs)
            return "draining"
        except aiohttp.ClientConnectionError:
            return "gone"

    if await eventually(draining, "/readyz 503 after SIGTERM") == "gone":
        return None
    try:
        return (await http.post("/api/rtc/offer", json={"sdp": "v=0", "type": "offer"})).status
    except aiohttp.ClientConnectionError:
        return None


async def stored_turns(tmp_path: Path, conversation_id: str) -> list[dict]:
    store = ConversationStore(tmp_path / "kimiaudio.db")
    await store.open()
    try:
        assert await store.integrity_problems() == []
        return (await store.get_conversation(conversation_id))["turns"]
    finally:
        await store.close()


@pytest.mark.parametrize("grace_s", [30.0, 0.3])
async def test_sigterm_mid_answer_exits_0_with_the_heard_part_stored(tmp_path, speech, grace_s):
    proc, port, lines = start_with_grace(tmp_path, grace_s)
    try:
        committed, done, late_status, errors = await answer_then_sigterm(proc, port, speech)
        code = await asyncio.to_thread(proc.wait, 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(lines)
    assert code == 0, output
    # Offers are refused while the answer drains; with a 0.3 s grace the drain can end before
    # the test's offer (on a loaded machine), which is no failure of the server's.
    assert late_status == 503 or (grace_s < 1 and late_status is None), (late_status, output)
    assert "Traceback" not in output and "ERROR" not in output, output
    user, assistant = (await stored_turns(tmp_path, committed["conversation_id"]))[-2:]
    assert user["role"] == "user" and user["has_audio"]
    assert assistant["role"] == "assistant" and assistant["has_audio"] and assistant["duration_s"] > 0.32
    if grace_s > 1:  # the answer was let finish and heard whole
        assert done["response"]["status"] in ("completed", "incomplete"), (done, output)
        assert not assistant["interrupted"], (done, output)
        assert assistant["duration_s"] == pytest.approx(len(assistant["audio_tokens"]) * 0.08, abs=0.01)
    else:  # cut at the end of the grace: stored as heard, marked interrupted, and said so
        assert assistant["interrupted"], (assistant, output)
        assert assistant["duration_s"] < len(assistant["audio_tokens"]) * 0.08 + 0.1
        details = done["response"]["status_details"]
        assert details["type"] == "cancelled" and "reason" not in details, details  # (not the client's doing)
        assert (details["error"]["type"], details["error"]["code"]) == ("server_error", "shutting_down")
    assert [e["error"]["code"] for e in errors] == ["shutting_down"], errors  # the session's end, said
