"""Out-of-band responses: a response.create with `conversation: "none"` (OpenAI's GA Realtime
API), an answer kept out of the conversation, such as a summary or a classification of what
was said, asked for while the conversation goes on.

Its context is the conversation as it stands when the request is taken from the session's
queue (in order with the items before it), or, with `input`, its own items: message items as
conversation.item.create takes them (their audio checked as an item's), and `item_reference`s
to the conversation's items (`[]`: none); an item it cannot take is an `error` naming it. The
session's instructions lead it, as they lead every prompt; the response's own `instructions`
are the task, put after the context as the user's last message, so that the model answers them
about it (Kimi-Audio has no system role). Without them, the context must end with a user item,
which is answered. The answer is text (`output_modalities` ["text"]); it runs
beside the conversation's own response (the engine batches them), is stored nowhere, and its
events name no conversation: response.created, output_item.added, content_part.added, the
text deltas, their ends and response.done, `conversation_id` null; no conversation.item.*.
A response.cancel naming its id cancels it; closing the session cancels it (`settle`), and it
still ends with its response.done (when the server stops: cancelled, `shutting_down`). While
one runs the session counts as answering, so that the server's stop gives it its grace.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kimiaudio.audio import pcm16
from kimiaudio.audio.io import check_speech_input
from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.audio.resampling import resample
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.events import TextDelta, TurnDone
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.pipeline.turn_handle import TurnHandle
from kimiaudio.pipeline.turn_request import HistoryTurn, TurnRequest
from kimiaudio.server.session import response_events, server_events
from kimiaudio.server.session.answer_request import prompted, truncation_of
from kimiaudio.server.session.client_events import ResponseCreate
from kimiaudio.server.session.conversation import Conversation
from kimiaudio.server.session.event_fields import ProtocolError
from kimiaudio.server.session.event_sender import EventSender
from kimiaudio.server.session.item_events import ItemCreate, ItemReference
from kimiaudio.server.session.owned_tasks import OwnedTasks
from kimiaudio.server.session.queued_turn import new_item_id, new_response_id
from kimiaudio.server.session.responder import CANCEL_GRACE_S, SHUTTING_DOWN
from kimiaudio.server.session.response_done import SHUTDOWN_CUT, final_status
from kimiaudio.server.session.session_settings import SessionSettings
from kimiaudio.text.output_type import TEXT

log = logging.getLogger(__name__)


class OutOfBand:
    def __init__(
        self,
        pipeline: Pipeline,
        conversation: Conversation,
        events: EventSender,
        tasks: OwnedTasks,
        stopping: Callable[[], bool] = lambda: False,
    ):
        """stopping: whether the server stops (a response asked for now ends failed, shutting_down)."""
        self._pipeline = pipeline
        self._stopping = stopping
        self._conversation = conversation
        self._events = events
        self._tasks = tasks
        self._running: dict[str, tuple[TurnHandle, asyncio.Task]] = {}  # response id -> its pipeline turn, its task
        self._cancelled: dict[str, str] = {}  # response id -> why it was cancelled

    @property
    def running(self) -> bool:
        return bool(self._running)

    async def start(self, request: ResponseCreate, settings: SessionSettings, event_id: str | None = None) -> None:
        """Start the response (its events follow as it runs) with `settings`, the session's as the
        response.create found them. An `input` item it cannot take (an id that is no item of the
        conversation, audio refused as an item's would be) is an `error` naming it and
        `event_id`, and no response; what cannot be answered ends the response failed at once,
        naming why, as the conversation's own responses end."""
        try:
            items = await self._context(request, settings)
        except ProtocolError as exc:
            self._events.error(exc.code, str(exc), exc.param, event_id)
            return
        if self._tasks.closing:  # closed while the history loaded: no response.created, so no end owed
            return
        response_id = new_response_id()
        limit = settings.sampling(TEXT, None, request.max_new_tokens).max_new_tokens
        announced = response_events.response_object(response_id, None, False, None, limit, request.metadata)
        self._events.send(response_events.response_created(announced))
        try:
            turn = self._turn(request, items, settings)
            handle = self._pipeline.submit(turn)
        except (ProtocolError, KimiAudioError) as exc:
            code = exc.code if isinstance(exc, ProtocolError) else None
            self._events.send(response_events.response_done(announced, "failed", "", {}, str(exc), error_code=code))
            return
        self._running[response_id] = (handle, self._tasks.spawn(self._run(announced, handle), "out-of-band response"))

    def cancel(self, response_id: str, reason: str = "client_cancelled") -> bool:
        """response.cancel naming an out-of-band response -> whether one runs by that id."""
        running = self._running.get(response_id)
        if running is None:
            return False
        self._cancelled[response_id] = reason
        self._pipeline.cancel(running[0])
        return True

    async def settle(self, reason: str) -> None:
        """The session closes: every response running is cancelled for `reason` (client_cancelled,
        shutting_down), and ends (its response.done sent) within the pipeline's grace."""
        tasks = [task for _, task in self._running.values()]
        for response_id in list(self._running):
            self.cancel(response_id, reason)
        if tasks:
            await asyncio.wait(tasks, timeout=CANCEL_GRACE_S)

    def _turn(self, request: ResponseCreate, items: list[list[HistoryTurn]], settings: SessionSettings) -> TurnRequest:
        if self._stopping():
            raise ProtocolError("shutting_down", SHUTTING_DOWN)
        if settings.kind == "transcription":
            raise ProtocolError(
                "transcription_session",
                'response.create: a transcription session (session.type "transcription") generates no responses',
            )
        if request.instructions:
            items.append([HistoryTurn("user", text=request.instructions)])
        if not items or items[-1][-1].role != "user":
            raise ProtocolError(
                "no_user_turn",
                "response.create: an out-of-band response answers its instructions, or a context that "
                "ends with a user item; this one has neither",
            )
        *history, answered = [part for item in items for part in item]
        instructions = settings.instructions
        if instructions:
            history.insert(0, HistoryTurn("user", text=instructions))
        return TurnRequest(
            conversation_id=self._conversation.id or f"out-of-band {self._events.session_id}",
            history=history,
            user_audio=answered.audio,
            user_text=answered.text if answered.audio is None else None,
            sampling=settings.sampling(TEXT, request.temperature, request.max_new_tokens),
            output_type=TEXT,
            truncation=truncation_of(settings.truncation, 1 if instructions else 0, len(items[-1])),
        )

    async def _context(self, request: ResponseCreate, settings: SessionSettings) -> list[list[HistoryTurn]]:
        """The items before the task, each as the prompt's messages: the conversation's, or the
        request's input."""
        conversation = self._conversation
        history = await conversation.history()
        if request.input is None:
            return [prompted(turn, conversation.audio_first(index)) for index, turn in history.items()]
        context: list[list[HistoryTurn]] = []
        for position, item in enumerate(request.input):
            if isinstance(item, ItemReference):
                if not conversation.has_item(item.item_id):
                    raise ProtocolError(
                        "item_not_found",
                        f"response.input[{position}]: {item.item_id[:80]!r} is not an item of this conversation",
                        f"response.input[{position}].id",
                    )
                index = conversation.items.index(item.item_id)
                if index is not None and index in history:  # (an answer nothing of which was heard: none)
                    context.append(prompted(history[index], conversation.audio_first(index)))
            else:
                context.append(_message(item, f"response.input[{position}]", settings))
        return context

    async def _run(self, announced: dict, handle: TurnHandle) -> None:
        response_id, item_id = announced["id"], new_item_id()
        events, text, done, stopped = self._events, "", None, False
        events.send(response_events.output_item_added(response_id, _item(item_id, "", "in_progress")))
        events.send(response_events.content_part_added(response_id, item_id, False))
        try:
            async for event in handle:
                if isinstance(event, TextDelta) and event.text:
                    text += event.text
                    events.send(response_events.text_delta(response_id, item_id, event.text))
                elif isinstance(event, TurnDone):
                    done = event
        except asyncio.CancelledError:  # the session closed: the turn would run on for nobody
            self._pipeline.cancel(handle)
            stopped = True
        except Exception as exc:  # a bug here must still end the response for the client
            log.exception("session %s: out-of-band response %s failed", events.session_id, response_id)
            self._pipeline.cancel(handle)
            done = TurnDone(status="failed", text=text, error=f"{type(exc).__name__}: {exc}")
        finally:
            self._running.pop(response_id, None)
        reason = self._cancelled.pop(response_id, None)
        done = done if done is not None else TurnDone(status="cancelled", text=text)
        status = final_status(reason is not None, done)
        error, error_code = (
            (SHUTDOWN_CUT, "shutting_down") if reason == "shutting_down" else (done.error, done.error_code)
        )
        for part in response_events.text_done(response_id, item_id, text, False):
            events.send(part)
        events.send(response_events.content_part_done(response_id, item_id, False, text))
        item = _item(item_id, text, "completed" if status == "completed" else "incomplete")
        events.send(response_events.output_item_done(response_id, item))
        events.send(
            response_events.response_done(
                announced,
                status,
                text,
                {},
                error,
                output=[item],
                reason=reason,
                error_code=error_code,
                usage=response_events.response_usage(done),
            )
        )
        if stopped:  # (its end told, the task is cancelled as it was asked)
            raise asyncio.CancelledError


def _message(item: ItemCreate, where: str, settings: SessionSettings) -> list[HistoryTurn]:
    role = "assistant" if item.role == "assistant" else "user"  # (a system message is context, as an item)
    if item.pcm16 is None:
        return [HistoryTurn(role, text=item.text)]
    audio = resample(pcm16.to_float(item.pcm16), settings.input_rate, SPEECH_INPUT_RATE)
    try:  # (as a conversation.item.create's audio is checked: user_items.py)
        check_speech_input(audio, settings.config.audio)
    except KimiAudioError as exc:
        raise ProtocolError("invalid_audio", f"{where}: {exc}", where) from None
    return prompted(HistoryTurn("user", text=item.text, audio=audio), item.audio_first)


def _item(item_id: str, text: str, status: str) -> dict:
    return server_events.message_item(item_id, "assistant", text, status=status)
