"""Bad input on the data channel, with a real aiortc client against the real server and
pipeline (demo checkpoint): every malformed event is answered with an `error` event (never a
silent traceback), the session lives on, and a setting the server cannot use is refused at
session.update or still lets the next turn end with response.done: never a hung turn."""

import json
import logging

import numpy as np
import pytest

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic

from helpers.audio import silence
from helpers.demo_server import kv_pool_full_again
from helpers.waiting import eventually

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

HOSTILE_MESSAGES = [
    "[" * 50000,  # json.loads: RecursionError
    '{"type": "session.update", "session": ' + '{"vad": ' * 60 + "{}" + "}" * 61,
    '{"type": "session.update", "session": {"vad": {"threshold": 1e400}}}',  # a float that is infinite
    '{"type": "session.update", "session": {"vad": {"threshold": NaN}}}',
    '{"type": "conversation.select", "conversation_id": "' + "9" * 5000 + '"}',
    '{"type": "conversation.select", "conversation_id": "../../etc"}',
    '{"type": "conversation.select", "conversation_id": ' + "9" * 5000 + "}",
    '"\\ud800"',
    b"\xff\xfe\x00",
    "x" * 70000,
    "",
    "null",
    '{"type": ["response.cancel"]}',
]


@pytest.fixture
async def client(demo_server):
    async with demo_server() as (http, pipeline):
        rtc = RtcClient(ScriptedMic())
        status, _ = await rtc.connect(http)
        assert status == 201
        await rtc.wait_for("session.created")
        yield rtc, pipeline
        await rtc.close()
        await kv_pool_full_again(pipeline)


async def test_malformed_events_get_error_events_and_the_session_lives_on(client, caplog):
    rtc, _ = client
    caplog.set_level(logging.WARNING)
    for count, message in enumerate(HOSTILE_MESSAGES, 1):
        rtc.channel.send(message)
        error = await rtc.wait_for("error", count=count)
        assert error["error"]["code"] in (
            "invalid_json",
            "too_large",
            "invalid_event",
            "unknown_event",
            "conversation_not_found",
            "invalid_value",
        ), (message[:60], error)
        assert "Error" not in error["error"]["message"] and "Traceback" not in error["error"]["message"]
    rtc.send({"type": "session.update", "session": {"vad": {"threshold": 0.6}}})
    updated = await rtc.wait_for("session.updated")
    assert updated["session"]["vad"]["threshold"] == 0.6
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize(
    "setting",
    [
        {"sampling": {"seed": 2**64}},
        {"sampling": {"seed": -(2**63) - 1}},
        {"sampling": {"text_top_k": 10**30}},
        {"sampling": {"audio_repetition_window": 2**62, "audio_repetition_penalty": 1.1}},
        {"sampling": {"max_new_tokens": 2**63}},
    ],
)
async def test_an_unusable_setting_is_refused_or_the_turn_still_ends(client, speech, setting):
    rtc, _ = client
    rtc.send({"type": "session.update", "session": setting})

    async def answered():  # whichever comes first: refused, or taken
        return rtc.of_type("error") or rtc.of_type("session.updated")

    await eventually(answered, f"an answer to {json.dumps(setting)}", interval=0.1)
    refused = rtc.of_type("error")
    if refused:
        assert refused[0]["error"]["code"] in ("invalid_value", "invalid_event"), refused
        return
    rtc.mic.say(np.concatenate([speech[0], silence(1.0)]))
    done = await rtc.wait_for("response.done")
    assert done["response"]["status"] in ("completed", "incomplete", "failed"), done
