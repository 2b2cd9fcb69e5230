"""The items of a session's conversation (kimiaudio/server/session/conversation.py and
conversation_items.py) over a real store, on both backends: an item whose turn is being
deleted is no item to name any more from the moment the delete begins, so an event answered
at once meanwhile (a truncate) cannot write into the turn going away; a delete that fails
leaves it an item."""

import asyncio

import pytest

from kimiaudio.errors import StoreUnavailableError
from kimiaudio.server.session.conversation import Conversation


async def test_an_item_being_deleted_is_no_item_to_name(store):
    conversation = Conversation(store, None, "sess_1")
    await conversation.ensure()
    index, _ = await conversation.add_user(None, "Hello.")
    conversation.next_item("item_hello", index)
    deleting = asyncio.ensure_future(conversation.delete_item("item_hello"))
    while not deleting.done() and conversation.has_item("item_hello"):
        await asyncio.sleep(0)  # (the delete runs up to its store write, then waits on it)
    assert not deleting.done(), "the item stayed nameable until its turn was gone"
    await deleting
    assert not conversation.has_item("item_hello") and await conversation.history() == {}
    await conversation.release()


async def test_an_item_whose_delete_failed_stays_an_item(store, monkeypatch):
    conversation = Conversation(store, None, "sess_1")
    await conversation.ensure()
    index, _ = await conversation.add_user(None, "Hello.")
    conversation.next_item("item_hello", index)

    async def away(*args):
        raise StoreUnavailableError("the database is away")

    monkeypatch.setattr(store, "write", away)
    with pytest.raises(StoreUnavailableError):
        await conversation.delete_item("item_hello")
    assert conversation.has_item("item_hello") and index in await conversation.history()
    monkeypatch.undo()
    await conversation.release()
