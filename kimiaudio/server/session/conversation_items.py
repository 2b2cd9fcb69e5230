"""The items of a session's conversation that its client was told of, oldest first: each one's
id and the index of its stored turn.

Each item event names the item before it (previous_item_id): `add` keeps the chain's end, and
an item deleted leaves the chain (the one before it is the end again, if it was the end). An
answer's item is told of when its response starts, before anything of it is stored: its index
is None until its turn is (`stored`), and stays None if the response stored nothing (or goes
back to None: nothing of it was heard in the end). The turns a conversation had before the
session took it up (opened with it, or conversation.select) were never items of this session:
they have no ids here, and an item event naming an id that is not here names no item. Nor
does an item whose turn is being deleted (`deleting`): an event that comes meanwhile (a
truncate, answered at once) must not write into the turn going away.
"""

from __future__ import annotations


class ConversationItems:
    def __init__(self) -> None:
        self._indexes: dict[str, int | None] = {}  # item id -> its stored turn's index (None: not stored)
        self._deleting: set[str] = set()

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._indexes and item_id not in self._deleting

    def deleting(self, item_id: str, going: bool = True) -> None:
        """The item's turn is being deleted (going False: it was not, after all)."""
        if going:
            self._deleting.add(item_id)
        else:
            self._deleting.discard(item_id)

    @property
    def last(self) -> str | None:
        """The newest item (None: none yet)."""
        return next(reversed(self._indexes), None)

    def add(self, item_id: str, index: int | None = None) -> str | None:
        """`item_id` is the conversation's newest item now -> the one before it (None: the first)."""
        previous = self.last
        self._indexes[item_id] = index
        return previous

    def stored(self, item_id: str, index: int | None) -> None:
        """The item's turn is stored at `index` (None: it has none any more)."""
        if item_id in self._indexes:
            self._indexes[item_id] = index

    def index(self, item_id: str) -> int | None:
        """The index of the item's stored turn (None: nothing of it is stored); KeyError for an
        id that is no item here."""
        return self._indexes[item_id]

    def remove(self, item_id: str) -> None:
        self._indexes.pop(item_id, None)
        self._deleting.discard(item_id)

    def clear(self) -> None:
        self._indexes.clear()
        self._deleting.clear()
