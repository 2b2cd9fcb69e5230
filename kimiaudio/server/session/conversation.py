"""The conversation a real-time session is talking in: its id, its history, its stored turns.

A session (realtime_session.py) speaks through this and never touches the store directly.
A new conversation is created at its first committed turn, so connecting without speaking
leaves nothing behind. The conversation a session talks in is leased to it (store/leases.py):
opening one another live session holds, on this instance or another sharing the database, is
refused with ConversationBusyError; the lease is released when the session moves on or closes.
Every write into the conversation it holds is made as its lease holder: should another session
have taken the lease over (this instance cut off from the database longer than the lease), the
write is refused (ConversationLostError) and so is every later one into that conversation,
and `on_lost` is called once, as soon as the store finds it out (a renewal, or such a write).
The history (what the pipeline's prompts are built from) is loaded
lazily from the store and kept in step with every turn stored or deleted afterwards, each turn
under its stored index (indexes only grow, and a deleted turn's is never given again:
store/turn_by_index.py). The items the client was told of, and their turns, are `items`
(conversation_items.py); deleting one deletes its turn, from the store and from the prompt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from kimiaudio.audio.rates import SPEECH_INPUT_RATE
from kimiaudio.errors import KimiAudioError, StoreUnavailableError
from kimiaudio.pipeline.turn_request import HistoryTurn
from kimiaudio.server.session.conversation_items import ConversationItems
from kimiaudio.store import ConversationLostError, ConversationStore, StoredTurn, as_stored, delete_turn, get_turn


class Conversation:
    def __init__(
        self,
        store: ConversationStore,
        conversation_id: str | None,
        session_id: str,
        on_lost: Callable[[str], None] | None = None,
    ):
        """on_lost(conversation_id): another session took over the conversation this one held."""
        self.store = store
        self.id = conversation_id
        self.session_id = session_id  # the lease holder
        self._history: dict[int, HistoryTurn] | None = None if conversation_id else {}  # by stored index
        self._audio_first: set[int] = set()  # user turns whose text came after their audio
        self._leased: str | None = None  # the conversation whose lease this session holds
        self.lost: str | None = None  # the conversation another session took over from this one
        self._on_lost = on_lost
        self.items = ConversationItems()

    @property
    def stored_id(self) -> str:
        """The id of the stored conversation the session talks in (ensure() makes one)."""
        if self.id is None:
            raise KimiAudioError("no conversation yet: it is created with the first committed turn")
        return self.id

    @property
    def last_item_id(self) -> str | None:
        """The newest item the client was told of."""
        return self.items.last

    def next_item(self, item_id: str, index: int | None = None) -> str | None:
        """`item_id` (its turn stored at `index`, if it is) is the conversation's newest item now
        -> the one before it (None: the first)."""
        return self.items.add(item_id, index)

    def has_item(self, item_id: str) -> bool:
        """Whether the client was told of this item of the conversation."""
        return item_id in self.items

    async def open(self) -> None:
        """Take the lease of the conversation the session was opened with (ConversationBusyError)."""
        if self.id is not None:
            await self._lease(self.id)

    async def ensure(self) -> bool:
        """Create the conversation if there is none yet; True if it was created now."""
        if self.id is not None:
            return False
        created = (await self.store.create_conversation())["id"]
        await self._lease(created)
        self.id = created
        self._history = {}
        return True

    @property
    def in_lost(self) -> bool:
        """The session still talks in the conversation another session took over from it."""
        return self.id is not None and self.id == self.lost

    async def _lease(self, conversation_id: str) -> None:
        await self.store.leases.acquire(conversation_id, self.session_id, on_lost=self._lease_lost)
        if self._leased is not None and self._leased != conversation_id:
            await self.release()
        self._leased = conversation_id
        if self.lost == conversation_id:  # taken up again, once its other holder let it go
            self.lost = None

    def _lease_lost(self, conversation_id: str) -> None:
        if conversation_id == self._leased:
            self._leased, self.lost = None, conversation_id
            if self._on_lost is not None:
                self._on_lost(conversation_id)

    def _holder(self, conversation_id: str) -> str | None:
        """The session a write into the conversation must be the lease holder as: this one, for
        the conversation it holds; none for one it left (a transcript still on its way to a
        turn of it). One taken over from it gets no write (ConversationLostError)."""
        if conversation_id == self.lost:
            raise ConversationLostError(conversation_id)
        return self.session_id if conversation_id == self._leased else None

    def closing(self) -> None:
        """The session is closing: another session opening its conversation waits for the
        release instead of being refused (lease_book.py)."""
        if self._leased is not None:
            self.store.leases.closing(self._leased, self.session_id)

    async def release(self) -> None:
        if self._leased is not None:
            leased, self._leased = self._leased, None
            try:
                await self.store.leases.release(leased, self.session_id)
            except StoreUnavailableError:
                pass  # the database is away: the lease expires by itself, unrenewed once the session is gone

    async def exists(self, conversation_id: str) -> bool:
        return await self.store.get_conversation(conversation_id) is not None

    async def select(self, conversation_id: str | None) -> None:
        """Continue another stored conversation (None: start a new one at the next turn);
        ConversationBusyError if another session holds it (this one keeps its own then)."""
        if conversation_id is not None:
            await self._lease(conversation_id)
        else:
            await self.release()
        self.id, self._history = conversation_id, (None if conversation_id else {})
        self._audio_first = set()
        self.items.clear()
        if conversation_id is not None:
            await self.history()

    async def history(self) -> dict[int, HistoryTurn]:
        """Every stored turn by its index, oldest first."""
        if self._history is None:
            stored = (await self.store.load_history(self.id) or []) if self.id is not None else []
            self._history = {  # (a system message is prompted as a user's text)
                t.index: HistoryTurn(
                    role="assistant" if t.role == "assistant" else "user",
                    text=t.text,
                    audio_tokens=t.audio_tokens,
                    audio=t.audio if t.role == "user" else None,
                )
                for t in stored
            }
            self._audio_first = {t.index for t in stored if t.audio_first}
        return self._history

    def audio_first(self, index: int) -> bool:
        """Whether the user turn at `index` had its text after its audio (the client's order)."""
        return index in self._audio_first

    async def add_user(
        self, audio: np.ndarray | None, text: str = "", audio_first: bool = False, system: bool = False
    ) -> tuple[int, HistoryTurn]:
        """Store a user turn, spoken or text, before the model starts on it; (its index, history
        turn). audio_first: its text came after its audio; system: a system message (text), which
        the model, having no system role, is prompted with as a user's text."""
        history = await self.history()
        if audio is not None:  # prompted as a reopened conversation's history will be: as stored
            audio = await asyncio.to_thread(as_stored, audio, "user")  # (an encode and a decode: off the loop)
        timings = {"speech_s": audio.size / SPEECH_INPUT_RATE} if audio is not None else {}
        conversation_id = self.stored_id
        index = await self.store.add_turn(
            conversation_id,
            "system" if system else "user",
            text,
            audio=audio,
            timings=timings,
            audio_first=audio_first,
            holder=self._holder(conversation_id),
        )
        turn = HistoryTurn(role="user", text=text, audio=audio)
        history[index] = turn
        if audio_first:
            self._audio_first.add(index)
        return index, turn

    async def last_turn(self) -> tuple[int, HistoryTurn] | None:
        """(index, turn) of the newest turn (the history mirrors every stored turn)."""
        history = await self.history()
        return next(reversed(history.items()), None)

    async def stored_item(self, item_id: str) -> StoredTurn | None:
        """The stored turn of an item the client was told of (KeyError: no such item), with
        its audio; None if nothing of it is stored."""
        index = self.items.index(item_id)
        return None if index is None else await get_turn(self.store, self.stored_id, index)

    async def delete_item(self, item_id: str) -> None:
        """Delete an item the client was told of (KeyError: no such item) and its stored turn:
        it is in no prompt and no stored conversation from now on."""
        index, conversation_id = self.items.index(item_id), self.stored_id
        history, audio_first = self._history, self._audio_first  # this conversation's, if select() moves on meanwhile
        if index is not None:
            self.items.deleting(item_id)
            try:
                await delete_turn(self.store, conversation_id, index, self._holder(conversation_id))
            except BaseException:
                self.items.deleting(item_id, going=False)
                raise
            if history is not None:
                history.pop(index, None)
            audio_first.discard(index)
        if self.id == conversation_id:
            self.items.remove(item_id)

    async def delete_answer(self, item_id: str, index: int) -> None:
        """An answer nothing of which was heard: its turn (at `index`) is deleted, from the store
        and the prompt; its item stays one the client was told of, with no stored turn."""
        conversation_id = self.stored_id
        await delete_turn(self.store, conversation_id, index, self._holder(conversation_id))
        if self._history is not None:
            self._history.pop(index, None)
        self.items.stored(item_id, None)

    async def store_transcript(self, conversation_id: str, index: int, transcript: str) -> None:
        """A spoken user turn's words (its conversation given: the session may have moved on)."""
        await self.store.update_turn(
            conversation_id, index, transcript=transcript, holder=self._holder(conversation_id)
        )

    async def set_user_codes(self, index: int, turn: HistoryTurn, codes: list[int]) -> None:
        turn.audio_tokens = list(codes)
        conversation_id = self.stored_id
        await self.store.update_turn(conversation_id, index, audio_tokens=codes, holder=self._holder(conversation_id))

    async def add_assistant(
        self, text: str, text_tokens: list[int], codes: list[int], timings: dict, interrupted: bool, audio: np.ndarray
    ) -> tuple[int, HistoryTurn]:
        conversation_id = self.stored_id
        index = await self.store.add_turn(
            conversation_id,
            "assistant",
            text,
            text_tokens=text_tokens,
            audio_tokens=codes,
            timings=timings,
            interrupted=interrupted,
            audio=audio,
            holder=self._holder(conversation_id),
        )
        turn = HistoryTurn(role="assistant", text=text, audio_tokens=codes)
        (await self.history())[index] = turn
        return index, turn

    async def record_heard(self, index: int, turn: HistoryTurn, pcm: np.ndarray, text: str, codes: list[int]) -> None:
        """While an answer plays: append the audio heard since the last call; its text and the
        codes of everything heard so far."""
        conversation_id = self.stored_id
        await self.store.append_heard(conversation_id, index, pcm, text, codes, holder=self._holder(conversation_id))
        turn.text, turn.audio_tokens = text, list(codes)

    async def update_assistant(
        self,
        index: int,
        turn: HistoryTurn,
        text: str,
        text_tokens: list[int],
        codes: list[int],
        timings: dict,
        audio: np.ndarray,
        interrupted: bool,
    ) -> None:
        """The answer's final record (after it ended, was cut, or truncated): what was heard,
        interrupted or not."""
        conversation_id = self.stored_id
        await self.store.update_turn(
            conversation_id,
            index,
            text=text,
            text_tokens=text_tokens,
            interrupted=interrupted,
            audio_tokens=codes,
            timings=timings,
            audio=audio,
            holder=self._holder(conversation_id),
        )
        turn.text, turn.audio_tokens = text, list(codes)
