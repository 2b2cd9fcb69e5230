"""Values in `key=value` log lines, written so that a line stays one line and reads one way.

What a client sends (a request's path, a field's text) may hold anything: a newline or a
carriage return would start a forged line of its own, a NUL makes `grep` take the whole log
for a binary file. A value is written as it is when nothing in it can be misread, else quoted
as a JSON string: spaces, quotes and '=' stay inside the quotes, and every control or other
unprintable character is an escape (\\n, \\r, \\u0000, \\u007f, \\u2028, ...).
"""

from __future__ import annotations

import json


def log_value(value) -> str:
    """`value` as text for a log line: as it is, or quoted and escaped where it could be misread."""
    text = str(value)
    if text and not any(c in ' "=' or not c.isprintable() for c in text):
        return text
    # ensure_ascii escapes the C0 controls and everything past ASCII; DEL is the one ASCII
    # control JSON leaves as it is.
    return json.dumps(text).replace("\x7f", "\\u007f")


def key_values(fields: dict) -> str:
    """`key=value ...` in the fields' order, a value quoted where it could be misread."""
    return " ".join(f"{key}={log_value(value)}" for key, value in fields.items())
