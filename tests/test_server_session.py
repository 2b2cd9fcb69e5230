"""RealtimeSession without a transport: the real pipeline (demo checkpoint), the real store,
silero VAD, a PlaybackTrack nobody plays, and a list for the events it sends.

- The microphone reader never waits on a turn: while the store takes seconds to write the
  user turn, `push_audio` returns as fast as the VAD does, and later speech is still heard.
- A text-only server (model.text_only) answers in text and stores the turns, without audio.
- A failing store ends the turn with an error event instead of leaving it hanging.
- Speech past audio.max_input_seconds is cut within it: each part is a turn, answered.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from kimiaudio.audio.vad import SileroVad
from kimiaudio.errors import StoreUnavailableError
from kimiaudio.pipeline.model_stack import ModelStack
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.server.app import new_context
from kimiaudio.server.session.event_shape import event_shape
from kimiaudio.server.session.realtime_session import RealtimeSession
from kimiaudio.server.session_registry import Admitted
from kimiaudio.server.transport.audio_track import PlaybackTrack
from kimiaudio.store import ConversationStore

from helpers.audio import silence
from helpers.demo_server import demo_config, demo_stack, kv_pool_full_again

FRAME = 320  # 20 ms at 16 kHz, as a WebRTC client delivers it


class Session:
    """A RealtimeSession built from a server context of its own (its pipeline and store
    started, no app), started; `events` collects what it sent."""

    def __init__(self, stack, config, tmp_path):
        self.context = new_context(config, stack)
        self.pipeline = self.context.pipeline = Pipeline(stack, config)
        self.store = self.context.store = ConversationStore(tmp_path / "history.db")
        self.events: list[dict] = []

    async def __aenter__(self) -> Session:
        await self.pipeline.start()
        await self.store.open()
        vad = await asyncio.get_running_loop().run_in_executor(self.context.vad_executor, SileroVad)
        admitted = Admitted("sess_test", vad, release=lambda: None)
        self.session = RealtimeSession(
            self.context, admitted, self.events.append, PlaybackTrack(), shape=event_shape("ga", webrtc=True)
        )
        self.session.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()
        await self.pipeline.stop()
        await self.store.close()
        self.context.vad_executor.shutdown(wait=True)

    async def say(self, pcm: np.ndarray) -> None:
        """Push `pcm` in 20 ms frames at real-time pace (as a microphone does)."""
        for start in range(0, pcm.size, FRAME):
            began = time.perf_counter()
            await self.session.push_audio(pcm[start : start + FRAME])
            await asyncio.sleep(max(0.0, FRAME / 16000 - (time.perf_counter() - began)))

    def of_type(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["type"] == kind]

    async def wait_for(self, kind: str, count: int = 1, timeout: float = 120.0) -> dict:  # catches a hang
        deadline = time.monotonic() + timeout
        while len(self.of_type(kind)) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {kind} (x{count}) in {timeout} s: {[e['type'] for e in self.events]}")
            await asyncio.sleep(0.02)
        return self.of_type(kind)[count - 1]


async def test_microphone_reader_never_waits_on_the_turn(demo_checkpoint, tmp_path, speech, monkeypatch):
    config = demo_config(demo_checkpoint, tmp_path)
    stored = asyncio.Event()  # the store's writes wait for this: a write that never ends, until set
    real_add_turn = ConversationStore.add_turn

    async def held_add_turn(self, *args, **kwargs):
        await stored.wait()
        return await real_add_turn(self, *args, **kwargs)

    monkeypatch.setattr(ConversationStore, "add_turn", held_add_turn)
    async with Session(demo_stack(demo_checkpoint), config, tmp_path) as s:
        await s.say(np.concatenate([silence(0.3), speech[0], silence(0.8)]))
        await s.wait_for("input_audio_buffer.speech_stopped")
        # The user speaks again while the first turn is still being stored: the microphone
        # reader goes on (one that waited for the write would never get through this utterance).
        assert not s.of_type("input_audio_buffer.committed")
        await asyncio.wait_for(s.say(np.concatenate([speech[1], silence(0.8)])), timeout=120)
        assert len(s.of_type("input_audio_buffer.speech_started")) == 2
        assert not s.of_type("input_audio_buffer.committed")  # still being stored
        stored.set()
        # Both turns are stored; the first one, overtaken by the second utterance, is history.
        await s.wait_for("input_audio_buffer.committed", count=2)
        done = await s.wait_for("response.done")
        assert done["response"]["status"] in ("completed", "incomplete")
        assert len(s.of_type("response.created")) == 1


async def test_text_only_server_answers_in_text(demo_checkpoint, tmp_path, speech):
    config = demo_config(demo_checkpoint, tmp_path)
    config.model.text_only = True
    stack = ModelStack.load(config)
    assert stack.detokenizer is None
    async with Session(stack, config, tmp_path) as s:
        assert s.session.describe()["output_type"] == "text" and not s.session.describe()["can_speak"]
        await s.say(np.concatenate([silence(0.3), speech[0], silence(0.8)]))
        done = await s.wait_for("response.done")
        assert done["response"]["status"] in ("completed", "incomplete"), done
        assert not s.of_type("output_audio_buffer.started") and not s.of_type("error")
        deltas = "".join(e["delta"] for e in s.of_type("response.output_text.delta"))
        assert deltas == done["response"]["text"]
        conversation = await s.store.get_conversation(s.session.conversation.id)
        user, assistant = conversation["turns"]
        assert user["has_audio"] and assistant["role"] == "assistant" and not assistant["has_audio"]
        assert assistant["text"] == deltas and not assistant["audio_tokens"]
        # Asking for speech is refused with a message, and the session keeps answering.
        await s.session.handle_message('{"type": "session.update", "session": {"output_type": "both"}}')
        assert "text only" in s.of_type("error")[-1]["error"]["message"]
        await s.say(np.concatenate([speech[1], silence(0.8)]))
        second = await s.wait_for("response.done", count=2)
        assert second["response"]["status"] in ("completed", "incomplete")


@pytest.mark.parametrize("role", ["user", "assistant"])
async def test_store_failure_ends_the_turn_with_an_error(demo_checkpoint, tmp_path, speech, monkeypatch, role):
    config = demo_config(demo_checkpoint, tmp_path)
    real_add_turn = ConversationStore.add_turn
    failures = []

    async def failing_add_turn(self, conversation_id, turn_role, *args, **kwargs):
        if turn_role == role and not failures:
            failures.append(turn_role)
            raise OSError("injected: disk full")
        return await real_add_turn(self, conversation_id, turn_role, *args, **kwargs)

    monkeypatch.setattr(ConversationStore, "add_turn", failing_add_turn)
    async with Session(demo_stack(demo_checkpoint), config, tmp_path) as s:
        await s.say(np.concatenate([silence(0.3), speech[0], silence(0.8)]))
        error = await s.wait_for("error")
        assert error["error"]["code"] == "storage_failed" and "disk full" in error["error"]["message"]
        if role == "assistant":  # the answer was made and played; only its record failed
            assert (await s.wait_for("response.done"))["response"]["status"] in ("completed", "incomplete")
        else:  # not stored, so not answered
            assert not s.of_type("response.created")
        await s.say(np.concatenate([speech[1], silence(0.8)]))  # the session goes on
        done = await s.wait_for("response.done", count=2 if role == "assistant" else 1)
        assert done["response"]["status"] in ("completed", "incomplete")
        # By order, not by a wait: the first turn's events all came before this answer's.
        assert len(s.of_type("response.created")) == (2 if role == "assistant" else 1)
        await kv_pool_full_again(s.pipeline)  # freed by the LM worker at its next iteration


async def test_a_transcription_that_cannot_run_is_reported_failed(demo_checkpoint, tmp_path, speech):
    config = demo_config(demo_checkpoint, tmp_path)
    async with Session(demo_stack(demo_checkpoint), config, tmp_path) as s:
        await s.session.handle_message(
            '{"type": "session.update", "session": {"turn_detection": null, '
            '"input_audio_transcription": {"model": "whisper-1"}}}'
        )
        assert s.of_type("session.updated")[-1]["session"]["audio"]["input"]["transcription"]["model"] == "whisper-1"
        await s.pipeline.stop()  # as in a shutdown: nothing more can be submitted
        s.session.commit(np.concatenate([speech[0], silence(0.3)]), "item_words")
        failed = await s.wait_for("conversation.item.input_audio_transcription.failed")
        assert failed["item_id"] == "item_words" and failed["content_index"] == 0
        assert failed["error"]["type"] == "transcription_error" and "not running" in failed["error"]["message"]
        assert not s.of_type("conversation.item.input_audio_transcription.completed")
        turn = (await s.store.get_conversation(s.session.conversation.id))["turns"][0]
        assert turn["has_audio"] and turn["transcript"] is None  # the turn is kept, without words


async def test_a_lost_database_loses_the_transcript_with_a_warning(
    demo_checkpoint, tmp_path, speech, monkeypatch, caplog
):
    """A database away while a transcript is stored: the client still gets the words, and an
    error saying why they were not kept; the log has one warning line, no traceback."""
    config = demo_config(demo_checkpoint, tmp_path)
    real_update_turn = ConversationStore.update_turn

    async def unavailable_for_transcripts(self, conversation_id, index, **fields):
        if "transcript" in fields:
            raise StoreUnavailableError("injected: the database does not answer")
        return await real_update_turn(self, conversation_id, index, **fields)

    monkeypatch.setattr(ConversationStore, "update_turn", unavailable_for_transcripts)
    async with Session(demo_stack(demo_checkpoint), config, tmp_path) as s:
        await s.session.handle_message(
            '{"type": "session.update", "session": {"turn_detection": null, '
            '"input_audio_transcription": {"model": "whisper-1"}}}'
        )
        s.session.commit(np.concatenate([speech[0], silence(0.3)]), "item_words")
        completed = await s.wait_for("conversation.item.input_audio_transcription.completed")
        error = s.of_type("error")[-1]["error"]  # sent before the words (input_transcription.py)
        assert error["code"] == "storage_failed" and "injected: the database does not answer" in error["message"]
        assert completed["item_id"] == "item_words"
    records = [r for r in caplog.records if "storing the transcript" in r.getMessage()]
    assert [(r.levelname, r.exc_info) for r in records] == [("WARNING", None)]


async def test_speech_past_the_input_limit_is_answered_cut_in_turns(demo_checkpoint, tmp_path, speech):
    """Speech longer than audio.max_input_seconds: the VAD cuts it within the limit, padding
    included, and that part is committed and answered as any turn; the speech after the cut is
    the next turn."""
    a, b = speech
    spoken = np.concatenate([silence(0.3), a, b])
    voiced = np.flatnonzero(np.abs(spoken) > 0.02)
    in_b = voiced[voiced >= spoken.size - b.size]
    config = demo_config(demo_checkpoint, tmp_path)
    config.vad.barge_in = False  # the next turn waits for the answer to the first, not cutting it
    config.vad.silence_ms = 800  # longer than the pause between the two sentences
    # The limit: from the padding before the voice to the middle of b (a word, not a pause).
    padding = config.vad.prefix_padding_ms * 16
    config.audio.max_input_seconds = ((in_b[0] + in_b[-1]) // 2 - voiced[0] + padding) / 16000
    async with Session(demo_stack(demo_checkpoint), config, tmp_path) as s:
        await s.say(np.concatenate([spoken, silence(1.5)]))
        await s.wait_for("input_audio_buffer.speech_stopped", count=2)
        assert not s.of_type("error"), s.of_type("error")  # (a refusal comes as the first part stops)
        cut, rest = s.of_type("input_audio_buffer.speech_stopped")[0], s.of_type("input_audio_buffer.speech_started")[1]
        assert 0 <= rest["audio_start_ms"] - cut["audio_end_ms"] <= 300  # cut mid-speech: it went on at once
        await s.wait_for("input_audio_buffer.committed", count=2)
        assert [e["item_id"] for e in s.of_type("input_audio_buffer.committed")] == [
            e["item_id"] for e in s.of_type("input_audio_buffer.speech_stopped")
        ]
        for count in (1, 2):
            assert (await s.wait_for("response.done", count=count))["response"]["status"] in ("completed", "incomplete")
        assert not s.of_type("error"), s.of_type("error")
        turns = (await s.store.get_conversation(s.session.conversation.id))["turns"]
        assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant"]
