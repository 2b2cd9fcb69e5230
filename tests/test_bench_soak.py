"""`bench --soak`, CI-sized: the real server on loopback (demo checkpoint), WebRTC sessions with
every kind of fault (barge-in, hang-up mid-answer and reconnect, malformed event), and the
end-of-run books (KV blocks, final statuses, stored user turns, integrity_check, RSS). A
second run with user turns silently lost on purpose must fail its books."""

import json
import os
import random
import subprocess
import sys

import pytest

from kimiaudio.bench.soak import run_soak
from kimiaudio.bench.soak_clients import FAULTS, MALFORMED, plan_faults
from kimiaudio.server.session import client_events
from kimiaudio.store import ConversationStore

from helpers.demo_server import demo_config, demo_stack
from helpers.serve_process import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def soak_cli(demo_checkpoint, cwd, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("KIMIAUDIO_API_KEY", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kimiaudio",
            "bench",
            "--soak",
            "--model",
            str(demo_checkpoint),
            "--device",
            "cpu",
            *args,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.timeout(900)
def test_soak_cli_passes_its_books(demo_checkpoint, tmp_path):
    result = soak_cli(
        demo_checkpoint,
        tmp_path,
        "--sessions",
        "2",
        "--turns",
        "3",
        "--seconds",
        "60",
        "--fault-rate",
        "0.5",
        "--max-new-tokens",
        "48",
        "--json",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["ok"] and all(check["ok"] for check in report["checks"].values()), report
    assert report["transports"] == ["webrtc", "websocket"]  # one session over each, both speaking
    assert all(n >= 1 for n in report["commits_by_transport"].values()), report["commits_by_transport"]
    # fault rate 0.5: every kind is planned at least once, and each planned fault happened
    assert set(report["planned_faults"]) == {"barge_in", "disconnect", "malformed"}, report["planned_faults"]
    assert all(report["faults"][kind] >= n for kind, n in report["planned_faults"].items()), report["faults"]
    assert report["commits"] >= report["planned_commits"] >= 6 + report["planned_faults"]["barge_in"], report
    assert report["responses_by_status"]["completed"] + report["responses_by_status"]["incomplete"] >= 1, report
    assert report["checks"]["leaked KV blocks"]["value"] == 0
    assert isinstance(report["busy_waits"], int) and report["busy_waits"] >= 0  # reported, not a check: a race


def test_a_soak_that_ends_before_its_plan_fails(demo_checkpoint, speech_wav, tmp_path):
    """--seconds shorter than connecting: no turn runs, no fault happens; that is no pass."""
    result = soak_cli(
        demo_checkpoint,
        tmp_path,
        "--sessions",
        "1",
        "--turns",
        "3",
        "--seconds",
        "0.001",
        "--fault-rate",
        "1",
        "--speech",
        str(speech_wav),
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    # Three turns, one of each fault: a barge-in turn commits two user turns, the others one each.
    assert "FAIL planned user turns not committed: 4 (limit 0)" in result.stdout, result.stdout
    assert "FAIL planned faults that never happened: 3 (limit 0)" in result.stdout, result.stdout
    assert "soak passed" not in result.stdout
    assert result.stdout.rstrip().endswith(
        "soak FAILED: planned user turns not committed; planned faults that never happened"
    ), result.stdout


def test_soak_books_catch_a_lost_user_turn(demo_checkpoint, tmp_path, monkeypatch):
    real_add_turn = ConversationStore.add_turn

    async def losing_add_turn(self, conversation_id, role, *args, **kwargs):
        index = await real_add_turn(self, conversation_id, role, *args, **kwargs)
        if role == "user":  # stored, then lost: what the books must notice
            await self.update_turn(conversation_id, index, audio=kwargs["audio"][:0])
        return index

    monkeypatch.setattr(ConversationStore, "add_turn", losing_add_turn)
    config = demo_config(demo_checkpoint, tmp_path)
    report = run_soak(
        demo_stack(demo_checkpoint), config, sessions=1, turns=1, seconds=60, fault_rate=0.0, max_new_tokens=24
    )
    assert not report["ok"]
    assert not report["checks"]["committed user turns not stored"]["ok"], report["checks"]


def test_fault_plan_covers_every_fault():
    plan = plan_faults(2, 3, 0.3, random.Random(5))
    assert len(plan) == 2 and all(len(turns) == 3 for turns in plan)
    assert {fault for turns in plan for fault in turns} >= set(FAULTS[1:])
    assert plan_faults(2, 3, 0.0, random.Random(5)) == [["none"] * 3] * 2


@pytest.mark.parametrize("event", MALFORMED, ids=lambda e: e[:30])
def test_every_malformed_soak_event_is_refused(event):
    """The soak expects an error event for each: the parser must refuse every one (an event the
    server accepts, e.g. with an extra field it ignores, would count as a lost error event)."""
    with pytest.raises(client_events.ProtocolError):
        client_events.parse_client_event(event)


def test_soak_url_of_a_front_with_no_instance_ready_says_so(haproxy_front, tmp_path):
    """A fleet's front with every instance down answers /healthz 503 itself: the soak stops in
    one line with that reason, not a hint about the API key (the 401's)."""
    from helpers.serve_process import free_port

    with haproxy_front([f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]) as front:
        front.wait_for_states({"kimi1": "DOWN", "kimi2": "DOWN"})
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("KIMIAUDIO_API_KEY", None)
        result = subprocess.run(
            [sys.executable, "-m", "kimiaudio", "bench", "--soak", "--url", front.url, "--sessions", "1"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert "/healthz answered 503: no kimiaudio instance is ready" in lines[0], lines[0]
    assert "API key" not in lines[0], lines[0]
