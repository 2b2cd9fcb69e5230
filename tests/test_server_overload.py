"""Overload: a server that cannot keep up with a microphone (the VAD slower than real time)
drops that audio once it is more than a second behind, counts it, warns once, and catches up,
instead of queueing frames without bound (memory) and hearing speech later and later."""

import logging
import time

import pytest

from kimiaudio.audio.vad import TurnDetector
from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic

from helpers.audio import silence
from helpers.metrics_scrape import scrape
from helpers.waiting import eventually

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


async def test_a_microphone_the_server_cannot_keep_up_with_is_dropped_not_queued(monkeypatch, caplog, demo_server):
    real_push = TurnDetector.push

    def slow_push(self, pcm):  # three times slower than real time (20 ms frames)
        time.sleep(0.04)
        return real_push(self, pcm)

    monkeypatch.setattr(TurnDetector, "push", slow_push)
    caplog.set_level(logging.WARNING)
    async with demo_server() as (http, _):
        client = RtcClient(ScriptedMic())
        assert (await client.connect(http))[0] == 201
        await client.wait_for("session.created")
        client.mic.say(silence(6.0))

        async def dropping():  # past the first second behind, about two frames in three are dropped
            dropped = (await scrape(http))["kimiaudio_input_audio_dropped_seconds_total"]
            return dropped if dropped > 1.5 else None

        dropped = await eventually(dropping, "more than 1.5 s of the microphone's 6 s dropped", interval=0.2)
        assert dropped < 6.0, dropped
        warnings = [r.getMessage() for r in caplog.records if "behind this microphone" in r.getMessage()]
        assert len(warnings) == 1, warnings  # not one per frame, nor one per time it falls behind
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        await client.close()
