"""A session's moves from one conversation to another: conversation.select, and leaving the
conversation another session took over.

conversation.select is taken from the session's queue, in order with the items created before
it (`select`): the conversation it names must exist (`conversation_not_found`) and be held by
no other live session (`conversation_busy`); the answer in progress is settled first (the
client moves on), then the session talks in that conversation (null: a new one at its next
turn), and says so in session.updated.

Should another session take the conversation over (this instance cut off from the database
for longer than the lease: store/leases.py), the client gets an `error` event,
`conversation_lost`, as soon as the store finds it out (`lost`); nothing more is stored in that
conversation, and the session goes on in a new one (as after `conversation.select` null: the
answer playing plays out, then session.updated, conversation_id null), which every entry
taken from then on goes to: the turn task leaves it (`leave_lost`) before the next entry.
"""

from __future__ import annotations

from collections.abc import Callable

from kimiaudio.server.session import server_events
from kimiaudio.server.session.conversation import Conversation
from kimiaudio.server.session.event_sender import EventSender
from kimiaudio.server.session.queued_turn import QueuedLeave, QueuedSelect
from kimiaudio.server.session.responder import Responder
from kimiaudio.server.session.turn_queue import TurnQueue
from kimiaudio.store import ConversationBusyError, ConversationLostError, ConversationNotFoundError


class ConversationMoves:
    def __init__(
        self,
        conversation: Conversation,
        responder: Responder,
        events: EventSender,
        queue: TurnQueue,
        describe: Callable[[], dict],
    ):
        """queue: the session's, that a lost conversation's leave waits its turn in; describe:
        the session object session.updated carries (RealtimeSession.describe)."""
        self._conversation = conversation
        self._responder = responder
        self._events = events
        self._queue = queue
        self._describe = describe

    async def select(self, work: QueuedSelect) -> None:
        conversation_id = work.conversation_id
        if conversation_id is not None and not await self._conversation.exists(conversation_id):
            message = f"no conversation with id {conversation_id!r}"
            self._events.error("conversation_not_found", message, "conversation_id", work.event_id)
            return
        await self._responder.settle(whole=True, reason="client_cancelled")  # (the client moves on)
        try:
            await self._conversation.select(conversation_id)
        except (ConversationBusyError, ConversationNotFoundError) as exc:  # (deleted meanwhile: not found)
            self._events.error(exc.code, str(exc), "conversation_id", work.event_id)
            return
        self._responder.forget_ended()
        self._events.send(server_events.session_updated(self._describe()))

    def lost(self, conversation_id: str) -> None:
        """Another session took over the conversation (the Conversation's on_lost): the client
        is told now; the session leaves it in its turn (the queue's order)."""
        message = f"{ConversationLostError(conversation_id)}: this session goes on in a new conversation"
        self._events.error(ConversationLostError.code, message)
        self._queue.put_nowait(QueuedLeave(conversation_id))

    async def leave_lost(self) -> None:
        await self._responder.settle(interrupt=False, whole=True)  # it plays out; it is stored no more
        await self._conversation.select(None)
        self._responder.forget_ended()
        self._events.send(server_events.session_updated(self._describe()))
