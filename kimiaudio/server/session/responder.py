"""The Responder runs a real-time session's responses: start, stream, interrupt, truncate
(each response's own state is a ResponseState, response_state.py; storing what was heard is
answer_storage.py's).

A response answers the newest stored user turn, which must be spoken (the pipeline answers
user audio; text items before it are context). It is submitted to the pipeline with the
conversation before it as history (and the session's instructions as a leading user text
message: answer_request.py); its events go out in the order response_events.py lists, its
text as transcript deltas (spoken answers) or text deltas (text answers), its audio through
the playback (at the session's speed, kept from its start: audio/time_stretch.py).
Barge-in (speech_started while a response is generating or playing) and response.cancel flush
the playback at once, cancel the pipeline turn, and store the assistant turn marked
interrupted and truncated to what was played, its audio, codes and text (nothing, if nothing
of it was heard: answer_storage.py); conversation.item.truncate (the client saying what it
played) overrides that estimate, for the response in progress or one of the last ones stored.
Once an answer has played out, while it is being stored before its response.done, there is
nothing left to cut: a barge-in or cancel then leaves it complete.
No response starts once the session closes, nor for a request that came once the server was
stopping (`stopping`: failed, `shutting_down`); a response whose task is cancelled cancels its
pipeline turn. A response.create while one is in progress is refused with an error. A
response that cannot be generated (no spoken user turn last, a transcription session, an
unknown voice, a turn the pipeline refuses) still ends: response.created, then response.done
`failed` with its error, so a client waiting for response.done never waits forever.

The Responder holds no session: it is given the parts it works with (pipeline, settings,
conversation, events, playback, tasks); it is the playback's listener for its responses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import numpy as np

from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE
from kimiaudio.audio.time_stretch import TimeStretch
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.events import AudioChunk, TextDelta, TurnDone, UserEncoded
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.server.session import response_events, server_events
from kimiaudio.server.session.answer_request import announced, answer_request
from kimiaudio.server.session.answer_storage import AnswerStorage
from kimiaudio.server.session.client_events import ResponseCreate
from kimiaudio.server.session.conversation import Conversation
from kimiaudio.server.session.event_fields import ProtocolError
from kimiaudio.server.session.event_sender import EventSender
from kimiaudio.server.session.heard_text import HeardText
from kimiaudio.server.session.owned_tasks import OwnedTasks
from kimiaudio.server.session.playback import Playback
from kimiaudio.server.session.queued_turn import new_response_id
from kimiaudio.server.session.response_done import answer_item, send_done
from kimiaudio.server.session.response_state import ResponseState
from kimiaudio.server.session.session_settings import SessionSettings
from kimiaudio.server.session.truncatable import Truncatable

log = logging.getLogger(__name__)

SHUTTING_DOWN = "the server is shutting down and starts no more answers"

CANCEL_GRACE_S = 3.0  # how long a cancelled pipeline turn may take to report TurnDone


class Responder:
    def __init__(
        self,
        pipeline: Pipeline,
        settings: SessionSettings,
        conversation: Conversation,
        events: EventSender,
        playback: Playback,
        tasks: OwnedTasks,
        on_audio: Callable[[float], None] = lambda seconds: None,
        stopping: Callable[[], bool] = lambda: False,
    ):
        """on_audio: the seconds of each piece of answer audio played (kimiaudio_audio_generated_seconds);
        stopping: whether the server stops, for what asks for an answer now."""
        self._pipeline = pipeline
        self._settings = settings
        self._conversation = conversation
        self._events = events
        self._playback = playback
        self._tasks = tasks
        self._on_audio = on_audio
        self._stopping = stopping
        heard_text = HeardText(pipeline.stack.tokenizer, pipeline.stack.specials)
        self._storage = AnswerStorage(conversation, events, playback, pipeline.samples_per_code, heard_text)
        self.current: ResponseState | None = None
        self.ended = 0  # responses ended (a silence after one may time out: idle_timer.py)
        self.cut_by_truncate = False  # the last response was cut by a truncate (a cancel may follow)
        self._truncatable = Truncatable(conversation)  # what a conversation.item.truncate may name

    # ----- start -----
    async def start(
        self,
        request: ResponseCreate | None,
        committed_at: float,
        event_id: str | None = None,
        settings: SessionSettings | None = None,
    ) -> None:
        """Answer the newest user turn with `settings` (a response.create's: the session's as it
        found them; None: as they are now); errors go to the client (naming `event_id`, the
        response.create's)."""
        if request is not None and self.current is not None and not self.current.cancelled:
            self._events.error(
                "conversation_already_has_active_response",
                f"response.create: response {self.current.id} "
                "is in progress; wait for its response.done or cancel it (response.cancel)",
                event_id=event_id,
            )
            return
        await self.settle()
        settings = settings or self._settings
        try:
            if self._stopping():
                raise ProtocolError("shutting_down", SHUTTING_DOWN)
            index, user_turn, turn = await answer_request(settings, self._conversation, request)
            if self._tasks.closing:  # the session closed meanwhile: an answer now would be for nobody
                return
            handle = self._pipeline.submit(turn)
        except ProtocolError as exc:
            self._fail(request, settings, exc.code, str(exc))
            return
        except Exception as exc:
            if not isinstance(exc, KimiAudioError):
                log.exception("session %s: submitting the turn failed", self._events.session_id)
            self._fail(request, settings, None, f"the turn could not be started ({exc})")
            return
        conversation = self._conversation
        response = ResponseState(turn.output_type, handle, index, user_turn, committed_at, turn.playback_speed)
        self.current, self.cut_by_truncate = response, False
        spoken = response.output_type == "both"
        if spoken:
            self._playback.begin(response.id, self)
        response.announced = announced(settings, self._conversation.id, request, response.id, response.output_type)
        self._events.send(response_events.response_created(response.announced))
        item = answer_item(response, status="in_progress")
        self._events.send(response_events.output_item_added(response.id, item))
        response.previous_item_id = conversation.next_item(response.item_id)
        self._events.send(server_events.item_added(conversation.id, item, response.previous_item_id))
        self._events.send(response_events.content_part_added(response.id, response.item_id, spoken))
        response.task = self._tasks.spawn(self._run(response), "response")
        response.recorder = self._tasks.spawn(self._storage.record(response), "recording")

    def _fail(self, request: ResponseCreate | None, settings: SessionSettings, code: str | None, message: str) -> None:
        """A response that could not be generated: created, and done at once, failed. `code`:
        the request's fault, named (None: the server's)."""
        output_type = settings.answer_type(request.output_type if request else None)
        response = announced(settings, self._conversation.id, request, new_response_id(), output_type)
        self._events.send(response_events.response_created(response))
        self._events.send(response_events.response_done(response, "failed", "", {}, message, error_code=code))

    # ----- stream -----
    async def _run(self, response: ResponseState) -> None:
        done: TurnDone | None = None
        spoken = response.output_type == "both"
        stretch = TimeStretch(response.speed, SPEECH_OUTPUT_RATE)
        delta = response_events.transcript_delta if spoken else response_events.text_delta
        try:
            async for event in response.handle:
                match event:
                    case UserEncoded(audio_tokens=codes):
                        await self._storage.store_user_codes(response, codes)
                    case TextDelta(text=text, text_tokens=tokens) if text:
                        response.text += text
                        response.text_tokens += tokens
                        if not response.cancelled:
                            self._events.send(delta(response.id, response.item_id, text))
                            if not spoken:
                                response.first_heard.set()
                    case AudioChunk(pcm=pcm, codes=codes):
                        response.codes += codes
                        self._play(response, stretch.push(pcm))
                    case TurnDone():
                        done = event
        except asyncio.CancelledError:
            # The pipeline did not report in time after a cancel, or the session's tasks were
            # stopped: then the pipeline turn is cancelled now (it would run on for nobody), and
            # either way the answer ends with what was heard of it.
            if not response.cancelled:
                self._cut(response, "client_cancelled")
        except Exception as exc:  # a bug here must still end the response for the client
            log.exception("session %s: response %s failed", self._events.session_id, response.id)
            self._pipeline.cancel(response.handle)
            done = TurnDone(status="failed", text=response.text, error=f"{type(exc).__name__}: {exc}")
        response.generation_ended = True
        response.done = done if done is not None else TurnDone(status="cancelled", text=response.text)
        if not response.cancelled and spoken:
            self._play(response, stretch.flush())
            self._playback.end()
        await self._finish(response, response.done)

    def _play(self, response: ResponseState, pcm: np.ndarray) -> None:
        """The next audio of the response, as it plays (stretched to its speed)."""
        if pcm.size == 0:
            return
        response.add_pcm(pcm)
        if not response.cancelled:
            self._playback.push(pcm)
            self._on_audio(pcm.size / SPEECH_OUTPUT_RATE)

    async def _finish(self, response: ResponseState, done: TurnDone) -> None:
        if done.status == "failed" and not response.cancelled:
            self._flush(response)  # what was stored while it played stays, marked interrupted
        elif not response.cancelled and response.pcm and self._playback.is_consumed:
            try:  # cut short by interrupt(); bounded in case nobody is receiving
                await asyncio.wait_for(response.playback_done.wait(), response.audio_seconds + 5.0)
            except TimeoutError:
                pass
        response.delivered = not response.cancelled
        await self._storage.stop_recording(response)
        if done.status != "failed" or response.cancelled:
            await self._storage.store_final(response, done)  # everything, or what was heard, marked interrupted
        send_done(self._events, self._conversation.id, response, done)
        if self.current is response:
            self.current = None
        self.ended += 1
        self._truncatable.ended(response)

    # ----- interrupt -----
    def interrupt(self, reason: str, played_samples: int | None = None) -> None:
        """Barge-in / response.cancel / truncate: silence now, cancel generation, keep what was heard."""
        response = self.current
        if response is None or response.cancelled or response.delivered:
            return
        self._cut(response, reason, played_samples)
        task = response.task
        if task is not None:
            # Only the wait for the pipeline's TurnDone is cut short, never the storing.
            asyncio.get_running_loop().call_later(
                CANCEL_GRACE_S, lambda: None if response.generation_ended else task.cancel()
            )

    def _cut(self, response: ResponseState, reason: str, played_samples: int | None = None) -> None:
        """Stop the response now: its playback, its pipeline turn; what was heard is what it keeps."""
        response.cancelled, response.cancel_reason = True, reason
        flushed = self._flush(response)
        response.played_samples = flushed if played_samples is None else played_samples
        self._pipeline.cancel(response.handle)
        response.playback_done.set()

    async def settle(self, interrupt: bool = True, whole: bool = False, reason: str = "turn_detected") -> None:
        """Wait until the response in progress has ended and is stored: interrupted now (for
        `reason`: a new turn's, or the client's), or (interrupt False) generated and played out.
        An interrupted one is waited for as long as the pipeline's grace to report its end,
        unless `whole`: then until its record is written too (before the session moves to another
        conversation, which its writes must not reach)."""
        response = self.current
        if response is None:
            return
        if interrupt:
            self.interrupt(reason)
        if response.task is not None:  # (an interrupted one reports within the grace)
            await asyncio.wait([response.task], timeout=CANCEL_GRACE_S + 1.0 if interrupt and not whole else None)

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        """conversation.item.truncate: the answer was heard up to audio_end_ms."""
        samples = audio_end_ms * SPEECH_OUTPUT_RATE // 1000
        response = self._truncatable.named(item_id, audio_end_ms, self.current)
        if response is self.current and not response.cancelled:  # generating or playing: stop it there
            self.interrupt("client_cancelled", samples)
            self.cut_by_truncate = True
        played = response.played_samples
        if played is None or samples <= played:  # keep what the client heard, stored before it is told
            response.played_samples, response.cancelled, response.truncated_ms = samples, True, audio_end_ms
            if response.done is None:  # still ending: its final record follows
                await self._storage.store_cut(response)
            elif response.stored is not None:
                await self._storage.store_final(response, response.done)
        self._events.send(server_events.item_truncated(item_id, audio_end_ms))

    def forget_ended(self) -> None:
        """The session moved to another conversation: its answers are not items of this one."""
        self._truncatable.forget()

    def _flush(self, response: ResponseState) -> int:
        """Stop the response's playback now (output_audio_buffer.cleared if it was playing) ->
        its samples played."""
        playing = response.first_played_at is not None and self._playback.response_id == response.id
        played = self._playback.flush()
        if playing:
            response.playback_cut = True
            self._events.send(response_events.audio_buffer("cleared", response.id))
        return played

    # ----- the playback's listener -----
    def playback_started(self, response_id: str) -> None:
        response = self.current
        if response is not None and response.id == response_id:
            response.first_played_at = time.monotonic()
            response.first_heard.set()
            self._events.send(response_events.audio_buffer("started", response_id))

    def playback_finished(self, response_id: str) -> None:
        response = self.current
        if response is not None and response.id == response_id:
            response.playback_done.set()
