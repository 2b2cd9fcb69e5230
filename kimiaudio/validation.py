"""Declared ranges of settings, and the one check that enforces them.

A dataclass field declared with `setting(default, Bounds(...))` carries its range in the
field's metadata; `check_fields` checks every field of such a dataclass against its type hint
and range, and `check_value` checks one value. The config sections (config/) and the
sampling parameters a request is built with (engine/sampling_params.py) are checked this way,
so a range is written once, next to the default it constrains. A field declared without
bounds is still type-checked; an integer without bounds must fit 64 bits, a float must be
finite.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any

from kimiaudio.errors import ConfigError

INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class Bounds:
    """What a setting may hold beyond its type. For a list, `choices` and `pattern` apply to
    each item."""

    min: float | None = None
    max: float | None = None
    min_open: bool = False  # min itself is excluded
    max_open: bool = False
    choices: tuple = ()
    pattern: str | None = None  # a string must match it in full
    means: str = ""  # what `pattern` allows, in words, for the error message

    def describe(self, expected: Any) -> str:
        """'an integer in [1, 65535]', 'a finite number > 0', "one of 'auto', 'cpu'" ..."""
        kind = typing.get_origin(expected) or expected
        if kind is list:
            return f"a list, each item {self._item(_item_type(expected))}"
        return self._item(expected)

    def _item(self, expected: Any) -> str:
        if self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.pattern is not None:
            return self.means or f"a string matching {self.pattern!r}"
        if expected is bool:
            return "true or false"
        if expected is int:
            return "a 64-bit integer" if (self.min, self.max) == (None, None) else "an integer " + self._range(True)
        if expected is float:
            return "a finite number" + ("" if (self.min, self.max) == (None, None) else " " + self._range(False))
        if expected is str:
            return "a string"
        return f"a {getattr(expected, '__name__', expected)}" if expected is not Any else "a value"

    def _limits(self, is_int: bool) -> tuple[float | None, float | None]:
        if not is_int:
            return self.min, self.max
        # A Python int is unbounded; nothing it is handed to downstream is.
        return (INT64[0] if self.min is None else self.min), (INT64[1] if self.max is None else self.max)

    def _range(self, is_int: bool) -> str:
        low, high = self._limits(is_int)
        if low is not None and high is not None:
            return f"in {'(' if self.min_open else '['}{low}, {high}{')' if self.max_open else ']'}"
        if low is not None:
            return f"{'>' if self.min_open else '>='} {low}"
        return f"{'<' if self.max_open else '<='} {high}"

    def admits(self, value: Any) -> bool:
        """Whether a value already of the right type is in range."""
        if self.choices and value not in self.choices:
            return False
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            return False
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            low, high = self._limits(isinstance(value, int))
            if low is not None and (value <= low if self.min_open else value < low):
                return False
            if high is not None and (value >= high if self.max_open else value > high):
                return False
        return True


NO_BOUNDS = Bounds()


def _item_type(list_type: Any) -> Any:
    args = typing.get_args(list_type)
    return args[0] if args else Any


def setting(default: Any = dataclasses.MISSING, bounds: Bounds = NO_BOUNDS, *, factory: Any = dataclasses.MISSING):
    """A dataclass field with a declared range: `port: int = setting(8080, Bounds(1, 65535))`."""
    return dataclasses.field(default=default, default_factory=factory, metadata={"bounds": bounds})


def check_value(where: str, value: Any, expected: Any, bounds: Bounds = NO_BOUNDS) -> Any:
    """`value` as a plain bool/int/float/str/list of the `expected` type, in `bounds`; else a
    ConfigError `<where>: expected <what>, got <value>`."""
    options = typing.get_args(expected) if typing.get_origin(expected) in (typing.Union, types.UnionType) else ()
    if options:
        if value is None and type(None) in options:
            return None
        expected = next(o for o in options if o is not type(None))
    converted = _converted(value, expected, bounds)
    if converted is _WRONG:
        raise ConfigError(f"{where}: expected {bounds.describe(expected)}, got {value!r}")
    return converted


_WRONG = object()


def _converted(value: Any, expected: Any, bounds: Bounds) -> Any:
    kind = typing.get_origin(expected) or expected
    if kind is list:
        if not isinstance(value, list):
            return _WRONG
        items = [_converted(item, _item_type(expected), bounds) for item in value]
        return _WRONG if any(item is _WRONG for item in items) else items
    if kind is bool:
        value = value if isinstance(value, bool) else _WRONG
    elif kind is int:
        value = int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else _WRONG
    elif kind is float:
        # bool is a number to Python but never what a user meant by a temperature.
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        value = float(value) if ok else _WRONG
    elif kind is not Any and not isinstance(value, kind):
        value = _WRONG
    if value is _WRONG or not bounds.admits(value):
        return _WRONG
    return value


def declared(cls: type) -> dict[str, tuple[Any, Bounds]]:
    """{field name: (type hint, bounds)} of a dataclass; fields without `setting` get NO_BOUNDS."""
    return _declared(cls)


@cache
def _declared(cls: type) -> dict[str, tuple[Any, Bounds]]:
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.metadata.get("bounds", NO_BOUNDS)) for f in dataclasses.fields(cls)}


def check_fields(obj: Any, prefix: str = "", like: type | None = None) -> None:
    """Check every field of the dataclass `obj` (frozen or not) in place, as plain values.
    `like`: a dataclass whose declared bounds hold for `obj`'s fields of the same name."""
    shared = declared(like) if like is not None else {}
    for name, (expected, bounds) in declared(type(obj)).items():
        bounds = shared[name][1] if name in shared else bounds
        value = getattr(obj, name)
        checked = check_value(prefix + name, value, expected, bounds)
        if checked is not value:
            object.__setattr__(obj, name, checked)
