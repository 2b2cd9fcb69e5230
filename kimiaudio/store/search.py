"""Finding conversations by what was said in them: a full-text index over the turns' words.

On SQLite, `turns_fts` indexes each turn's `text` (the assistant's words, a user's typed text) and
`transcript` (the user's spoken words, transcribed) as an external-content FTS5 table over
`turns`: triggers keep it in step with every insert, update and delete (a conversation's
cascade delete included), and the migration that creates it indexes the rows already there.

On PostgreSQL, a stored generated column `turns.search_doc` (a tsvector of text and
transcript under the `simple` configuration: no stemming, no stop words, like unicode61)
with a GIN index plays the same part. Its parser would read an e-mail address, a URL, a host
or file name, a version or a decimal number as one lexeme ("ada@example.com"), which no query
term ("example") is a prefix of; so the column is made of the text with every character but
letters and digits of ASCII turned into a space (`_pg_words`), and a query's terms are cut from it by
the same expression, so that both agree on what a letter is (Python's idea of one, as in
query_tokens, is not PostgreSQL's: Devanagari's vowel signs, say).

A client's `q` is never passed to either as syntax: each run of letters and digits in it
becomes a prefix term, FTS5's quoted "run"* (query_tokens) or tsquery's run:*, all of them
required anywhere in one turn, so quotes, parentheses, AND/OR/NEAR, `-`, `col:` or a lone `*`
are matched as text (or, being no letters, not at all), never parsed. Both backends take the
same terms: "wel-kno" is `wel` and `kno` on each, never a phrase on one only. Each backend
folds the case of the terms as it folds its documents'. The two differ where the tokenizers
do: PostgreSQL keeps diacritics (FTS5 here folds them).
"""

from __future__ import annotations

import re
from typing import Any

from kimiaudio.errors import KimiAudioError
from kimiaudio.store.conversation_pages import NEWEST_FIRST, PageEnd, older_than
from kimiaudio.store.sql import Sql

MAX_QUERY_CHARS = 200
MAX_QUERY_WORDS = 16

# The index, per backend: part of the schema's migration that adds the `transcript` column
# (schema.py). Statements end with ";" at a line's end; a trigger's body is one statement.
_SQLITE_SCHEMA = """
CREATE VIRTUAL TABLE turns_fts USING fts5(
    text, transcript, content='turns', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
);
CREATE TRIGGER turns_fts_insert AFTER INSERT ON turns BEGIN
    INSERT INTO turns_fts(rowid, text, transcript) VALUES (new.id, new.text, new.transcript);
END;
CREATE TRIGGER turns_fts_delete AFTER DELETE ON turns BEGIN
    INSERT INTO turns_fts(turns_fts, rowid, text, transcript) VALUES ('delete', old.id, old.text, old.transcript);
END;
CREATE TRIGGER turns_fts_update AFTER UPDATE OF text, transcript ON turns BEGIN
    INSERT INTO turns_fts(turns_fts, rowid, text, transcript) VALUES ('delete', old.id, old.text, old.transcript);
    INSERT INTO turns_fts(rowid, text, transcript) VALUES (new.id, new.text, new.transcript);
END;
INSERT INTO turns_fts(turns_fts) VALUES ('rebuild');
"""
_POSTGRES_SCHEMA = """
ALTER TABLE turns ADD COLUMN search_doc tsvector GENERATED ALWAYS AS (
    to_tsvector('simple'::regconfig, coalesce(text, '') || ' ' || coalesce(transcript, ''))
) STORED;
CREATE INDEX turns_search_doc ON turns USING GIN (search_doc);
"""
SEARCH_SCHEMA = {"sqlite": _SQLITE_SCHEMA, "postgresql": _POSTGRES_SCHEMA}


def _pg_words(text: str) -> str:
    """PostgreSQL: the SQL text `text` with each run of ASCII characters but letters and digits
    one space. Only ASCII: in the C locale a server may have, [:alnum:] knows no other letters,
    and every word of another script would go; the parser splits those as it always did."""
    return f"regexp_replace({text}, '[\\x01-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+', ' ', 'g')"


# PostgreSQL's column over letters and digits only (see the module docstring): schema version 9.
_POSTGRES_WORDS_ONLY = f"""
ALTER TABLE turns DROP COLUMN search_doc;
ALTER TABLE turns ADD COLUMN search_doc tsvector GENERATED ALWAYS AS (
    to_tsvector('simple'::regconfig, {_pg_words("coalesce(text, '') || ' ' || coalesce(transcript, '')")})
) STORED;
CREATE INDEX turns_search_doc ON turns USING GIN (search_doc);
"""
SEARCH_WORDS_ONLY = {"sqlite": "", "postgresql": _POSTGRES_WORDS_ONLY}
# The tsquery requiring every word of the query (the parameter) as a prefix; NULL for none.
_POSTGRES_QUERY = (
    "SELECT to_tsquery('simple', string_agg(w || ':*', ' & ')) "
    f"FROM regexp_split_to_table({_pg_words('?')}, ' ') AS w WHERE w <> ''"
)


class SearchQueryError(KimiAudioError):
    """A search query that cannot be used (too long, too many words)."""


def query_words(q: str) -> list[str]:
    """The words of a client's query, checked; empty for a blank query."""
    if len(q) > MAX_QUERY_CHARS:
        raise SearchQueryError(f"q: at most {MAX_QUERY_CHARS} characters, got {len(q)}")
    if "\x00" in q:  # FTS5 ends a quoted string there, PostgreSQL refuses it in any text
        raise SearchQueryError("q: must not contain a NUL character")
    words = q.split()
    if len(words) > MAX_QUERY_WORDS:
        raise SearchQueryError(f"q: at most {MAX_QUERY_WORDS} words, got {len(words)}")
    return words


def query_tokens(words: list[str]) -> list[str]:
    """The runs of letters and digits in the words: all of a query that reaches FTS5 (an
    underscore separates, as unicode61 has it). Their case is left to FTS5, as its documents' is."""
    return [token for word in words for token in re.findall(r"[^\W_]+", word)]


def match_expression(words: list[str]) -> str:
    """FTS5 MATCH text requiring every token as a prefix, each quoted (never parsed as syntax)."""
    return " ".join(f'"{token}"*' for token in query_tokens(words))


def search_conversations(sql: Sql, words: list[str], limit: int, after: PageEnd | None = None) -> list[dict[str, Any]]:
    """The conversations (newest first) with a turn holding every word, in list_conversations' shape."""
    if not query_tokens(words):  # only punctuation: no word can match
        return []
    if sql.kind == "postgresql":
        # The words as given, or lower-cased by Python: a server in the C locale folds the case
        # of ASCII letters only, so "ZÜRICH" finds "zürich" only in the second form; PostgreSQL's
        # own folding, in other locales, is what finds Greek's final sigma or Turkish's dotted İ.
        query = " ".join(words)  # (only its words reach the tsquery, never its syntax)
        expressions = [query, query.lower()]
        matching = (
            f"SELECT t.conversation_id FROM turns t WHERE t.search_doc @@ (({_POSTGRES_QUERY}) || ({_POSTGRES_QUERY}))"
        )
    else:
        expressions = [match_expression(words)]
        matching = (
            "SELECT t.conversation_id FROM turns_fts JOIN turns t ON t.id = turns_fts.rowid WHERE turns_fts MATCH ?"
        )
    condition, values = older_than(after)
    rows = sql.execute(
        "SELECT c.id, c.title, c.created_at, c.updated_at, "
        "(SELECT COUNT(*) FROM turns n WHERE n.conversation_id = c.id) AS num_turns "
        f"FROM conversations c WHERE c.id IN ({matching}) AND {condition} {NEWEST_FIRST} LIMIT ?",
        [*expressions, *values, limit],
    ).fetchall()
    keys = ("id", "title", "created_at", "updated_at", "num_turns")
    return [dict(zip(keys, row)) for row in rows]
