"""README's compatibility table says of every Realtime request field what the code does with it:
each field that realtime_params.py declares for the Realtime session, response.create, the calls
route and the client secrets is in a row of README's table with the status it is declared with
(honoured, refused unless its value asks for nothing, or ignored)."""

import re
from pathlib import Path

import pytest

from kimiaudio.server.inputs.openai_params import Fields
from kimiaudio.server.inputs.realtime_params import (
    AUDIO_INPUT_FIELDS,
    AUDIO_OUTPUT_FIELDS,
    CALL_FIELDS,
    CLIENT_SECRET_FIELDS,
    EXPIRES_AFTER_FIELDS,
    INPUT_TRANSCRIPTION_FIELDS,
    RESPONSE_AUDIO_OUTPUT_FIELDS,
    RESPONSE_FIELDS,
    SESSION_FIELDS,
    TURN_DETECTION_FIELDS,
)

README = Path(__file__).resolve().parents[1] / "README.md"


def table_rows() -> list[list[str]]:
    """The cells of every table row in README's compatibility section."""
    text = README.read_text()
    start = text.index("**Compatibility table.**")
    end = text.index("python -m kimiaudio bench --http", start)
    rows = []
    for line in text[start:end].splitlines():
        if line.startswith("|") and not line.startswith("| ---"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def names(cells: list[str]) -> set[str]:
    return {name for cell in cells for name in re.findall(r"`([^`]+)`", cell)}


def names_field(name: str, field: str) -> bool:
    """`name` (as README writes it) is `field`, a path ending in it, or a path through it."""
    return name == field or name.endswith("." + field) or name.startswith(field + ".")


def rows_of(group: str) -> list[tuple[set[str], str]]:
    """(the field names, the status) of the rows of one group: the Realtime session's fields
    ("session", the table with GA and beta columns), response.create's ("response"), or a
    route of the table with a route column."""
    found = []
    for row in table_rows():
        if len(row) != 4 or row[0] in ("route", "GA field"):
            continue
        if row[0] in ("realtime calls", "client secrets"):
            if group == row[0]:
                found.append((names(row[1:2]), row[2]))
        elif row[0] in ("transcriptions", "chat", "realtime"):
            continue
        elif (group == "response") == row[0].startswith("response.create:") and group in ("session", "response"):
            found.append((names(row[:2]), row[2]))
    return found


def declared(fields: Fields) -> list[tuple[str, str]]:
    return (
        [(f, "honoured") for f in fields.honoured]
        + [(f, "refused") for f in fields.neutral]
        + [(f, "ignored") for f in fields.ignored]
    )


GROUPS = {
    "session": [
        SESSION_FIELDS,
        AUDIO_INPUT_FIELDS,
        AUDIO_OUTPUT_FIELDS,
        TURN_DETECTION_FIELDS,
        INPUT_TRANSCRIPTION_FIELDS,
    ],
    "response": [RESPONSE_FIELDS, RESPONSE_AUDIO_OUTPUT_FIELDS],
    "realtime calls": [CALL_FIELDS],
    "client secrets": [CLIENT_SECRET_FIELDS, EXPIRES_AFTER_FIELDS],
}


def unlisted(group: str, declarations: list[Fields]) -> list[tuple[str, str]]:
    """The (field, status) pairs of `declarations` that no row of `group` lists with that status."""
    rows = rows_of(group)
    assert rows, f"README's compatibility table has no rows for {group}"
    return sorted(
        (field, status)
        for fields in declarations
        for field, status in declared(fields)
        if not any(
            status in row_status and any(names_field(n, field) for n in row_names) for row_names, row_status in rows
        )
    )


@pytest.mark.parametrize("group", GROUPS)
def test_every_declared_realtime_field_is_in_the_table_with_its_status(group):
    missing = unlisted(group, GROUPS[group])
    assert not missing, f"{group}: fields README's table does not list with their status: {missing}"


def test_the_check_finds_a_field_left_out_or_listed_with_another_status():
    fields = Fields(honoured=frozenset({"never_documented", "tools"}), neutral={"instructions": (bool, "")})
    assert unlisted("session", [fields]) == [
        ("instructions", "refused"),
        ("never_documented", "honoured"),
        ("tools", "honoured"),
    ]
