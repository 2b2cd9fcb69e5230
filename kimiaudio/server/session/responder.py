"""The Responder runs a real-time session's responses: start, stream, interrupt, truncate,
store (each response's own state is a ResponseState, response_state.py).

A response answers the newest stored user turn, which must be spoken (the pipeline answers
user audio; text items before it are context). It is submitted to the pipeline with the
conversation before it as history (and the session's instructions as a leading user text
message); its text goes out as response.audio_transcript.delta (spoken answers) or
response.text.delta (text answers), its audio through the playback. Barge-in (speech_started
while a response is generating or playing) and response.cancel flush the playback at once,
cancel the pipeline turn, and store the assistant turn marked interrupted and truncated to
the audio that was played; conversation.item.truncate (the client saying what it played)
overrides that estimate, for the response in progress or one of the last ones stored. A
response.create while a response is in progress is refused (barge-in, a user turn, replaces it).

Nothing heard is lost: the assistant turn is stored when its first audio is played (its first
text sent, for a text answer), marked interrupted, and what was heard since is added at least
every RECORD_INTERVAL_S; the final record (everything, or the heard part of a cut answer,
with the speech codes, which the pipeline reports at the end) replaces it when it ends.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

import numpy as np

from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE
from kimiaudio.errors import KimiAudioError, StoreUnavailableError
from kimiaudio.pipeline.events import AudioChunk, TextDelta, TurnDone, UserEncoded
from kimiaudio.pipeline.turn_request import HistoryTurn, TurnRequest
from kimiaudio.server.session import client_events as ce
from kimiaudio.server.session import events
from kimiaudio.server.session.response_state import ResponseState

log = logging.getLogger(__name__)


def _log_store_failure(session_id: str, what: str, exc: BaseException) -> None:
    """A lost database is one warning line (the session talks on); anything else is a bug."""
    if isinstance(exc, StoreUnavailableError):
        log.warning("session %s: %s failed: %s", session_id, what, exc)
    else:
        log.exception("session %s: %s failed", session_id, what)


CANCEL_GRACE_S = 3.0  # how long a cancelled pipeline turn may take to report TurnDone
RECORD_INTERVAL_S = 1.0  # a playing answer's heard part is stored at least this often
NUM_TRUNCATABLE = 8  # ended responses a conversation.item.truncate may still name


class Responder:
    def __init__(self, session, playback):
        self.session = session  # RealtimeSession: settings, conversation, pipeline, send, ids
        self.playback = playback
        playback.on_playback_started, playback.on_playback_finished = self._playback_started, self._playback_finished
        self.current: ResponseState | None = None
        self.ended: dict[str, ResponseState] = {}  # item id -> the newest responses that ended (for truncate)

    # ----- start -----
    async def start(self, request: ce.ResponseCreate | None, committed_at: float) -> None:
        """Answer the newest user turn (it must be spoken); errors go to the client."""
        s = self.session
        if request is not None and self.current is not None and not self.current.cancelled:
            s.send_error(
                "conversation_already_has_active_response",
                f"response.create: response {self.current.id} "
                "is in progress; wait for its response.done or cancel it (response.cancel)",
            )
            return
        await self.settle()
        last = await s.conversation.last_turn() if s.conversation.id is not None else None
        if last is None or last[1].role != "user" or last[1].audio is None:
            s.send_error(
                "no_user_audio",
                "response.create: the conversation does not end with a spoken user turn "
                "(kimiaudio answers speech; text items are context for the next spoken turn)",
            )
            return
        index, user_turn = last
        history = list((await s.conversation.history())[:-1])
        instructions = request.instructions if request and request.instructions is not None else s.settings.instructions
        if instructions:
            history.insert(0, HistoryTurn("user", text=instructions))
        output_type = s.settings.answer_type(request.output_type if request else None)
        named = request.voice if request else None
        try:
            voice = s.settings.voice_prompt(named) if output_type == "both" else None
        except KimiAudioError as exc:  # an unknown name, or its voice was deleted meanwhile
            s.send_error("unknown_voice", f"response.create: {exc}", "response.voice" if named else "session.voice")
            return
        sampling = s.settings.sampling(
            output_type, request.temperature if request else None, request.max_new_tokens if request else None
        )
        turn = TurnRequest(
            conversation_id=s.conversation.id,
            history=history,
            user_audio=user_turn.audio,
            sampling=sampling,
            output_type=output_type,
            voice=voice,
        )
        try:
            handle = s.pipeline.submit(turn)
        except Exception as exc:
            if not isinstance(exc, KimiAudioError):
                log.exception("session %s: submitting the turn failed", s.id)
            s.send_error("response_failed", f"the turn could not be started ({exc})")
            return
        r = ResponseState(
            f"resp_{secrets.token_hex(6)}",
            f"item_{secrets.token_hex(8)}",
            output_type,
            handle,
            index,
            user_turn,
            committed_at,
            playback_done=asyncio.get_running_loop().create_future(),
        )
        self.current = r
        if output_type == "both":
            self.playback.begin(r.id)
        s.send(events.response_created(r.id, s.conversation.id))
        s.send(events.output_item_added(r.id, self._item(r, status="in_progress")))
        r.task = s.tasks.spawn(self._run(r), "response")
        r.recorder = s.tasks.spawn(self._record(r), "recording")

    def _item(self, r: ResponseState, status: str = "completed", index: int | None = None) -> dict:
        return events.message_item(r.item_id, "assistant", r.text, r.output_type == "both", index, r.cancelled, status)

    # ----- stream -----
    async def _run(self, r: ResponseState) -> None:
        s = self.session
        done: TurnDone | None = None
        delta = events.transcript_delta if r.output_type == "both" else events.text_delta
        try:
            async for event in r.handle:
                if isinstance(event, UserEncoded):
                    await self._store_user_codes(r, event.audio_tokens)
                elif isinstance(event, TextDelta) and event.text:
                    r.text += event.text
                    if not r.cancelled:
                        s.send(delta(r.id, r.item_id, event.text))
                        if r.output_type == "text":
                            r.first_heard.set()
                elif isinstance(event, AudioChunk):
                    r.add_pcm(np.asarray(event.pcm, dtype=np.float32).reshape(-1))
                    r.codes += event.codes
                    if not r.cancelled:
                        self.playback.push(r.pcm[-1])
                elif isinstance(event, TurnDone):
                    done = event
        except asyncio.CancelledError:
            pass  # the pipeline did not report in time after a cancel: finish with what we have
        except Exception as exc:  # a bug here must still end the response for the client
            log.exception("session %s: response %s failed", s.id, r.id)
            s.pipeline.cancel(r.handle)
            done = TurnDone(status="failed", text=r.text, error=f"{type(exc).__name__}: {exc}")
        r.generation_ended = True
        r.done = done if done is not None else TurnDone(status="cancelled", text=r.text)
        if not r.cancelled and r.output_type == "both":
            self.playback.end()
        await self._finish(r, r.done)

    async def _finish(self, r: ResponseState, done: TurnDone) -> None:
        s = self.session
        if done.status == "failed" and not r.cancelled:
            self.playback.flush()  # what was stored while it played stays, marked interrupted
        elif not r.cancelled and r.pcm and self.playback.is_consumed:
            try:  # cut short by interrupt(); bounded in case nobody is receiving
                await asyncio.wait_for(asyncio.shield(r.playback_done), r.audio_seconds + 5.0)
            except TimeoutError:
                pass
        r.stop_recording.set()
        await asyncio.wait([r.recorder])  # a write in flight lands before the final one
        if done.status != "failed" or r.cancelled:
            await self._store(r, done)  # final: everything, or what was heard, marked interrupted
        status = "cancelled" if r.cancelled else done.status
        text = r.text or done.text
        for event in events.text_done(r.id, r.item_id, text, r.output_type == "both"):
            s.send(event)
        item = self._item(
            r, "incomplete" if r.cancelled or status == "failed" else "completed", r.stored[0] if r.stored else None
        )
        s.send(events.output_item_done(r.id, item))
        s.send(
            events.response_done(
                r.id,
                status,
                text,
                r.timings(done),
                done.error,
                output=[item],
                reason=r.cancel_reason,
                error_code=done.error_code,
                prefill_tokens_cached=done.prefill_tokens_cached,
                prefill_tokens_computed=done.prefill_tokens_computed,
                usage=events.response_usage(done),
            )
        )
        if self.current is r:
            self.current = None
        self.ended[r.item_id] = r
        if len(self.ended) > NUM_TRUNCATABLE:
            del self.ended[next(iter(self.ended))]

    # ----- store -----
    async def _store_user_codes(self, r: ResponseState, codes: list[int]) -> None:
        try:
            await self.session.conversation.set_user_codes(r.user_index, r.user_turn, codes)
        except Exception as exc:  # e.g. the conversation was deleted meanwhile: the answer goes on
            _log_store_failure(self.session.id, "storing the user turn's codes", exc)

    async def _store(self, r: ResponseState, done: TurnDone) -> None:
        """The assistant turn's final record: inserted, or the progressive one updated."""
        s = self.session
        pcm, codes = r.heard(done, s.pipeline.samples_per_code)
        text, timings = r.text or done.text, r.timings(done)
        try:
            if r.stored is None:
                await self._insert(r, text, list(done.text_tokens), codes, timings, r.cancelled, pcm)
            else:
                await s.conversation.update_assistant(
                    *r.stored, text, list(done.text_tokens), codes, timings, pcm, r.cancelled
                )
        except Exception as exc:
            _log_store_failure(s.id, "storing the assistant turn", exc)
            s.send_error("storage_failed", f"the answer could not be stored ({exc})")

    async def _insert(
        self,
        r: ResponseState,
        text: str,
        text_tokens: list[int],
        codes: list[int],
        timings: dict,
        interrupted: bool,
        pcm: np.ndarray,
    ) -> None:
        s = self.session
        index, turn = await s.conversation.add_assistant(text, text_tokens, codes, timings, interrupted, pcm)
        r.stored = (index, turn)
        previous, s.last_item_id = s.last_item_id, r.item_id
        s.send(
            events.item_created(
                s.conversation.id,
                events.message_item(r.item_id, "assistant", text, r.output_type == "both", index, interrupted),
                previous,
            )
        )

    async def _record(self, r: ResponseState) -> None:
        """Store the answer from its first audio played (or text sent) on, marked interrupted,
        and add what was heard at least every RECORD_INTERVAL_S: after a crash, the store holds
        what the user heard, as audio and as the codes of that audio (history after a restart)."""
        s, loop = self.session, asyncio.get_running_loop()
        stop, first_heard = loop.create_task(r.stop_recording.wait()), loop.create_task(r.first_heard.wait())
        await asyncio.wait([stop, first_heard], return_when=asyncio.FIRST_COMPLETED)
        try:
            while not r.stop_recording.is_set():
                heard = self._heard_samples(r)
                pcm = r.pcm_between(r.recorded_samples, heard)
                if r.stored is None:
                    await self._insert(r, r.text, [], [], {}, True, np.zeros(0, np.float32))
                codes = r.codes_heard(max(heard, r.recorded_samples), s.pipeline.samples_per_code)
                await s.conversation.record_heard(*r.stored, pcm, r.text, codes)
                r.recorded_samples = max(heard, r.recorded_samples)
                await asyncio.wait([stop], timeout=RECORD_INTERVAL_S)
        except Exception as exc:  # the answer goes on; its final record is attempted at the end
            _log_store_failure(s.id, "storing the answer as it plays", exc)
            s.send_error("storage_failed", f"the answer could not be stored as it played ({exc})")
        finally:
            stop.cancel()
            first_heard.cancel()

    def _heard_samples(self, r: ResponseState) -> int:
        if r.output_type != "both" or self.playback.response_id != r.id:
            return r.recorded_samples
        return min(self.playback.played_samples_24k, r.num_samples)

    # ----- interrupt -----
    def interrupt(self, reason: str, played_samples: int | None = None) -> None:
        """Barge-in / response.cancel / truncate: silence now, cancel generation, keep what was heard."""
        r = self.current
        if r is None or r.cancelled:
            return
        r.cancelled, r.cancel_reason = True, reason
        flushed = self.playback.flush()
        r.played_samples = flushed if played_samples is None else played_samples
        self.session.pipeline.cancel(r.handle)
        if not r.playback_done.done():
            r.playback_done.set_result(None)
        if r.task is not None:
            # Only the wait for the pipeline's TurnDone is cut short, never the storing.
            asyncio.get_running_loop().call_later(
                CANCEL_GRACE_S, lambda: None if r.generation_ended else r.task.cancel()
            )

    async def settle(self) -> None:
        """Interrupt any response in progress and wait until it is stored."""
        r = self.current
        if r is not None:
            self.interrupt("turn_detected")
            if r.task is not None:
                await asyncio.wait([r.task], timeout=CANCEL_GRACE_S + 1.0)

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        """conversation.item.truncate: the answer was heard up to audio_end_ms."""
        s = self.session
        samples = audio_end_ms * SPEECH_OUTPUT_RATE // 1000
        r = self.current if self.current is not None and self.current.item_id == item_id else self.ended.get(item_id)
        if r is None:
            raise ce.ProtocolError(
                "item_not_found",
                f"conversation.item.truncate: {item_id!r} is not an assistant "
                f"item of this session's last {NUM_TRUNCATABLE} responses",
                "item_id",
            )
        if r is self.current:  # generating or playing: stop it there
            if r.cancelled:
                r.played_samples = min(r.played_samples or 0, samples)
            else:
                self.interrupt("client_cancelled", samples)
        else:  # already stored whole (or as an earlier cut): keep what the client heard
            r.played_samples = min(samples, r.played_samples if r.played_samples is not None else samples)
            r.cancelled = True
            if r.stored is not None and r.done is not None:
                await self._store(r, r.done)
        s.send(events.item_truncated(item_id, audio_end_ms))

    # ----- playback callbacks -----
    def _playback_started(self, response_id: str) -> None:
        r = self.current
        if r is not None and r.id == response_id:
            r.first_played_at = time.monotonic()
            r.first_heard.set()
            self.session.send(events.audio_started(response_id))

    def _playback_finished(self, response_id: str) -> None:
        r = self.current
        if r is not None and r.id == response_id and not r.playback_done.done():
            r.playback_done.set_result(None)
