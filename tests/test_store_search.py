"""Searching conversations by what was said (kimiaudio/store/search.py): on a real SQLite file
and on a real PostgreSQL server (store_location), the same queries find the same conversations."""

import sqlite3

import numpy as np
import pytest

from kimiaudio.store import ConversationStore, schema
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


# Each turn in a conversation of its own; a query's expected conversations by key. Every word
# of a query is text: its runs of letters and digits are each required, as prefixes, anywhere
# in one turn (in any order). Read as FTS5 or tsquery syntax instead, most of these would find
# something else (an OR or NEAR would find more, a NOT or column filter fewer) or raise.
SAID = {
    "cats": "Cats AND dogs (together) NEAR the river",
    "quote": 'She said "hello there" to me',
    "dash": "a well-known e-mail address in snake_case",
    "unicode": "grüße aus zürich, 東京 naïve café",
    "plain": "nothing special here",
}
FOUND_BY = [
    ('"', []),
    ('"hello', ["quote"]),
    ('"hello there"', ["quote"]),
    ('"there hello"', ["quote"]),  # no phrase: each word anywhere
    ('"hello river"', []),
    ("cats AND", ["cats"]),
    ("dogs OR nothing", []),  # OR as syntax: cats and plain
    ("(together)", ["cats"]),
    ("a AND (", ["cats"]),
    ("NEAR(cats river)", ["cats"]),
    ("NEAR(hello there)", []),  # NEAR as syntax: quote
    ("*", []),
    ("cat*", ["cats"]),
    ("ca*ts", []),
    ("-dogs", ["cats"]),
    ("cats -dogs", ["cats"]),  # "-" as NOT: nothing
    ("e-mail", ["dash"]),
    ("wel-kno", ["dash"]),  # each run of letters a prefix, not a phrase of them
    ("known-well", ["dash"]),
    ("case_snake", ["dash"]),  # "_" separates, as both tokenizers have it
    ("text:cats", []),  # a column filter: cats
    ("^cats", ["cats"]),
    ("'; DROP TABLE turns; --", []),
    ("zürich", ["unicode"]),
    ("ZÜRICH GRÜSSE", []),  # ß is not "ss"
    ("ZÜRICH GRÜ", ["unicode"]),
    ("東京", ["unicode"]),
    ("NAÏVE caf", ["unicode"]),
    ("", ["cats", "quote", "dash", "unicode", "plain"]),  # no words: every conversation
    ("  \t ", ["cats", "quote", "dash", "unicode", "plain"]),
]


@pytest.fixture
async def said(store):
    """SAID stored, each in a conversation of its own: key -> conversation id."""
    found = {}
    for key, text in SAID.items():
        conv = await store.create_conversation()
        await store.add_turn(conv["id"], "assistant" if key != "quote" else "user", text)
        found[key] = conv["id"]
    return found


async def test_fts_syntax_in_a_query_is_text_not_syntax(store, said):
    for q, keys in FOUND_BY:
        assert sorted(ids(await store.list_conversations(q=q))) == sorted(said[k] for k in keys), q
    assert len(await store.list_conversations()) == len(SAID)  # nothing was dropped


async def test_only_punctuation_finds_nothing_and_words_inside_punctuation_are_found(store):
    conv = await store.create_conversation()
    await store.add_turn(conv["id"], "assistant", "Hello, world! (version 3.5)")
    assert await store.list_conversations(q="?!") == []
    assert ids(await store.list_conversations(q="(hello, WORLD!)")) == [conv["id"]]


async def test_the_parts_of_addresses_names_and_numbers_are_words(store):
    """An e-mail address, a URL, a file name, a version and a decimal number are found by any of
        their words and as they were said, on both backends (PostgreSQL's parser reads each as one
        lexeme), and upper-case words and scripts with vowel signs by themselves (Python's
    lower-casing and idea of a letter are not PostgreSQL's)."""
    conv = await store.create_conversation()
    await store.add_turn(
        conv["id"],
        "assistant",
        "Mail ada@example.com the report.pdf from https://docs.example.org/v2/notes: version 1.2.3 costs 21.50, "
        "ΣΊΣΥΦΟΣ in İSTANBUL, नमस्ते दुनिया, สวัสดีครับ",
    )
    for q in ["ada@example.com", "example", "report.pdf", "pdf", "docs.example.org/v2", "notes", "https", "v2"]:
        assert ids(await store.list_conversations(q=q)) == [conv["id"]], q
    for q in ["1.2.3", "version 2", "21.50", "50", "ΣΊΣΥΦΟΣ", "İSTANBUL", "İstanbul", "दुनिया", "สวัสดีครับ"]:
        assert ids(await store.list_conversations(q=q)) == [conv["id"]], q
    assert await store.list_conversations(q="example.net") == []


async def test_the_migration_reindexes_the_turns_already_stored(store_location, monkeypatch):
    """A database of version 8 is migrated and the words of its turns found as version 9 cuts them."""
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 8)
    store = ConversationStore(store_location)
    await store.open()
    conv = await store.create_conversation()
    await store.add_turn(conv["id"], "user", "write to ada@example.com")
    await store.close()
    monkeypatch.undo()
    store = ConversationStore(store_location)
    await store.open()
    try:
        assert ids(await store.list_conversations(q="example")) == [conv["id"]]
        assert await store.integrity_problems() == []
    finally:
        await store.close()


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
    old.conn.execute(
        "INSERT INTO turns (conversation_id, turn_index, role, text, created_at) "
        "VALUES ('c1', 0, 'assistant', 'an elephant never forgets', 0)"
    )
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
