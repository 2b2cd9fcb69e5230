"""Searching conversations by what was said (kimiaudio/store/search.py): on a real SQLite file
and on a real PostgreSQL server (store_location), the same queries find the same conversations."""

import sqlite3

import numpy as np
import pytest

from kimiaudio.store import schema
from kimiaudio.store.schema import open_database
from kimiaudio.store.search import SearchQueryError



def ids(found):
    return [c["id"] for c in found]


async def test_finds_user_transcripts_and_assistant_text_and_follows_updates_and_deletes(store):
    weather = await store.create_conversation()
    cooking = await store.create_conversation()
    spoken = np.zeros(1600, np.float32)
    index = await store.add_turn(weather["id"], "user", audio=spoken)
    await store.add_turn(weather["id"], "assistant", "Sunny skies tomorrow.")
    await store.add_turn(cooking["id"], "user", "How long do I boil an egg?")
    await store.add_turn(cooking["id"], "assistant", "Boil it for nine minutes.")
    assert await store.list_conversations(q="forecast") == []
    await store.update_turn(weather["id"], index, transcript="What is the forecast for Zürich")
    assert ids(await store.list_conversations(q="forecast")) == [weather["id"]]
    assert ids(await store.list_conversations(q="zürich FORE")) == [weather["id"]]  # case, prefixes
    if not store.is_shared:  # SQLite: FTS5's unicode61 folds diacritics; PostgreSQL's `simple` keeps them
        assert ids(await store.list_conversations(q="zurich")) == [weather["id"]]
    assert ids(await store.list_conversations(q="sunny")) == [weather["id"]]
    assert ids(await store.list_conversations(q="egg")) == [cooking["id"]]  # a user's typed text
    assert ids(await store.list_conversations(q="boil minutes")) == [cooking["id"]]
    assert await store.list_conversations(q="boil sunny") == []  # every word, in one turn
    turn = (await store.get_conversation(weather["id"]))["turns"][index]
    assert turn["transcript"] == "What is the forecast for Zürich" and turn["text"] == ""
    assert (await store.load_history(weather["id"]))[index].transcript == turn["transcript"]
    # The answer's text changes as it is heard (append_heard): the index follows it.
    await store.append_heard(weather["id"], 1, np.zeros(240, np.float32), "Rain all week.")
    assert await store.list_conversations(q="sunny") == []
    assert ids(await store.list_conversations(q="rain")) == [weather["id"]]
    await store.delete_conversation(cooking["id"])
    assert await store.list_conversations(q="egg") == []
    assert len(await store.list_conversations(q="")) == 1  # no words: every conversation


@pytest.mark.parametrize("q", ['"', '"unbalanced', 'a AND (', "NEAR(a b", "*", "-x", "col:x", "^a", "a OR", "'; DROP"])
async def test_fts_syntax_in_a_query_is_text_not_syntax(store, q):
    conv = await store.create_conversation()
    await store.add_turn(conv["id"], "assistant", "a AND (b) NEAR x")
    found = await store.list_conversations(q=q)
    assert found == [] or ids(found) == [conv["id"]]


async def test_only_punctuation_finds_nothing_and_words_inside_punctuation_are_found(store):
    conv = await store.create_conversation()
    await store.add_turn(conv["id"], "assistant", "Hello, world! (version 3.5)")
    assert await store.list_conversations(q="?!") == []
    assert ids(await store.list_conversations(q="(hello, WORLD!)")) == [conv["id"]]


async def test_a_query_too_long_is_refused(store):
    with pytest.raises(SearchQueryError, match="at most 200 characters"):
        await store.list_conversations(q="x" * 201)
    with pytest.raises(SearchQueryError, match="at most 16 words"):
        await store.list_conversations(q=" ".join(["w"] * 17))


def test_migration_indexes_the_turns_already_stored(tmp_path, monkeypatch):
    """A database of version 4 (before transcripts and search) is migrated and its rows found."""
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 4)
    old = open_database(tmp_path / "k.db")
    old.conn.execute("INSERT INTO conversations (id, created_at, updated_at) VALUES ('c1', 0, 0)")
    old.conn.execute("INSERT INTO turns (conversation_id, turn_index, role, text, created_at) "
                     "VALUES ('c1', 0, 'assistant', 'an elephant never forgets', 0)")
    old.close()
    monkeypatch.undo()
    db = open_database(tmp_path / "k.db")
    hits = db.conn.execute("SELECT rowid FROM turns_fts WHERE turns_fts MATCH 'elephant'").fetchall()
    assert len(hits) == 1
    assert db.conn.execute("SELECT transcript FROM turns").fetchone()[0] is None
    db.close()
    conn = sqlite3.connect(tmp_path / "k.db")  # the index is whole and consistent
    conn.execute("INSERT INTO turns_fts(turns_fts) VALUES ('integrity-check')")
    conn.close()
