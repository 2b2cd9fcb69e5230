"""The session's microphone side (server/session/mic_input.py) with a real silero VAD on its own
thread: the noise reducer runs where the VAD runs, never on the event loop, and what a commit
takes is what it would take if the reducer ran inline."""

import asyncio
import threading

import numpy as np

from kimiaudio.audio import noise_reduction
from kimiaudio.audio.vad import SileroVad, TurnDetector, vad_executor
from kimiaudio.config import load_config
from kimiaudio.server.session import mic_input
from kimiaudio.server.session.event_sender import EventSender
from kimiaudio.server.session.mic_input import MicInput
from kimiaudio.server.session.session_settings import SessionSettings

from helpers.audio import silence


class ThreadNotingReduction(noise_reduction.NoiseReduction):
    """The real reducer, noting the thread each call to it runs on."""

    calls: list[tuple[str, str]] = []  # (method, thread)

    def push(self, pcm):
        self.calls.append(("push", threading.current_thread().name))
        return super().push(pcm)

    def flush(self):
        self.calls.append(("flush", threading.current_thread().name))
        return super().flush()

    def reset(self):
        self.calls.append(("reset", threading.current_thread().name))
        super().reset()


def mic(turn_detection: str, executor):
    settings = SessionSettings(load_config(), can_speak=True)
    settings.turn_detection = turn_detection
    settings.noise_reduction = "near_field"
    sent: list[dict] = []
    utterances: list[np.ndarray] = []
    events = EventSender("sess_test", lambda: None, sent.append)
    detector = TurnDetector(SileroVad(), settings.turn_settings())
    on_utterance = lambda audio, item_id: utterances.append(audio)  # noqa: E731
    return MicInput(settings, detector, executor, events, lambda: None, on_utterance, on_utterance, lambda: None), sent


def chunks(pcm: np.ndarray, step: int = 1600):
    return [pcm[i : i + step] for i in range(0, pcm.size, step)]


def test_the_reducer_runs_on_the_vad_thread_and_commits_all_it_was_given(monkeypatch, speech):
    monkeypatch.setattr(mic_input, "NoiseReduction", ThreadNotingReduction)
    ThreadNotingReduction.calls = []
    noisy = np.concatenate([silence(0.3), speech[0]]) + np.random.default_rng(0).normal(0, 0.01, speech[0].size + 4800)
    noisy = noisy.astype(np.float32)

    async def run():
        with vad_executor() as executor:
            commit_mic, _ = mic("none", executor)
            for chunk in chunks(noisy):
                await commit_mic.push(chunk)
            committed, _ = await commit_mic.take_commit()
            commit_mic.clear()

            vad_mic, sent = mic("server_vad", executor)
            for chunk in chunks(noisy):
                await vad_mic.push(chunk)
            await vad_mic.take_commit()
            vad_mic.clear()
            await asyncio.get_running_loop().run_in_executor(executor, lambda: None)  # (the clears ran)
            return committed, [e["type"] for e in sent]

    committed, vad_events = asyncio.run(run())
    methods = [method for method, _ in ThreadNotingReduction.calls]
    assert methods.count("flush") == 2 and methods.count("reset") == 2, methods  # (two commits, two clears)
    assert {thread.split("_")[0] for _, thread in ThreadNotingReduction.calls} == {"kimiaudio-vad"}
    inline = noise_reduction.NoiseReduction("near_field")
    np.testing.assert_array_equal(committed, np.concatenate([inline.push(noisy), inline.flush()]))
    assert vad_events[:2] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"]
