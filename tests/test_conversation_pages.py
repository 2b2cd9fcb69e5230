"""The conversation list a page at a time (kimiaudio/store/conversation_pages.py), on a real
SQLite file and a real PostgreSQL server: pages cut by position, so walking them with the
cursors gives every conversation once in the list's order, ties of updated_at included, and a
conversation that moves to the top meanwhile repeats nothing and hides nothing else."""

import base64

import pytest

from kimiaudio.store.conversation_pages import PageCursorError, PageEnd, page_end, read_cursor


def ids(found):
    return [c["id"] for c in found]


async def walk(store, limit: int, q: str = "", between=None) -> list[str]:
    """Every page of `limit` in turn (`between`: awaited after the first page)."""
    seen, after = [], None
    while True:
        page = await store.list_conversations(limit + 1, q, after)
        seen += ids(page[:limit])
        if len(page) <= limit:
            return seen
        after = page_end(page[limit - 1])
        if between is not None:
            await between()
            between = None


async def set_updated_at(store, conversation_ids, when: float) -> None:
    def update(db):
        with db.atomic():
            for conversation_id in conversation_ids:
                db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", [when, conversation_id])

    await store.write(update)


async def test_pages_give_every_conversation_once_in_order(store):
    made = [(await store.create_conversation())["id"] for _ in range(7)]
    for conversation_id in made:
        await store.add_turn(conversation_id, "assistant", "the same words in each")
    await set_updated_at(store, made[2:5], 1000.0)  # a tie across a page's end: ordered by id
    everything = ids(await store.list_conversations(100))
    assert sorted(everything) == sorted(made)
    for limit in (1, 2, 3, 7):
        assert await walk(store, limit) == everything
        assert await walk(store, limit, q="words") == everything  # search pages alike


async def test_a_conversation_moving_to_the_top_meanwhile_hides_nothing(store):
    made = [(await store.create_conversation())["id"] for _ in range(6)]
    before = ids(await store.list_conversations(100))
    oldest = before[-1]

    async def new_turn():
        await store.add_turn(oldest, "user", "and one more thing")

    seen = await walk(store, 2, between=new_turn)
    # It is newer than the page already read now, so it is not met again; every other is met once.
    assert seen == [c for c in before if c != oldest] and sorted(before) == sorted(made)
    assert ids(await store.list_conversations(1)) == [oldest]


def encoded(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "nope",
        encoded("[1, 2]"),
        encoded("null"),
        encoded('["x", "123"]'),
        encoded('[NaN, "c"]'),
        encoded(f'[{"9" * 400}, "c"]'),  # past any float
        encoded("[" * 3000),  # nested past the parser's stack
        encoded('[true, "c"]'),
    ],
)
def test_a_cursor_the_server_did_not_give_is_refused(cursor):
    with pytest.raises(PageCursorError, match="cursor"):
        read_cursor(cursor)


def test_a_cursor_names_its_page_end():
    end = PageEnd(1764000000.123456, "c" * 32)
    assert read_cursor(end.cursor()) == end
