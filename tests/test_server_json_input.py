"""Client JSON is parsed one way everywhere: limits and plain errors, never another exception."""

import pytest

from kimiaudio.server.inputs.json_input import JsonInputError, parse_json


@pytest.mark.parametrize(
    "data, code",
    [
        ("[" * 50000 + "]" * 50000, "invalid_json"),  # would be a RecursionError
        ('{"a": ' * 40 + "1" + "}" * 40, "invalid_json"),  # valid, but deeper than the limit
        ("1" * 5000, "invalid_json"),  # more digits than int() converts
        ('{"x": NaN}', "invalid_json"),
        ('{"x": Infinity}', "invalid_json"),
        ('{"x": -1e400}', "invalid_json"),  # overflows to -inf
        ('"\\ud800"', "invalid_json"),  # a lone surrogate
        ('{"\\udfff": 1}', "invalid_json"),
        (b"\xff\xfe{}", "invalid_json"),  # not UTF-8
        ("{", "invalid_json"),
        (" " * (2 << 20), "too_large"),
    ],
)
def test_bad_json_is_a_json_input_error(data, code):
    with pytest.raises(JsonInputError) as info:
        parse_json(data, max_bytes=1 << 20)
    assert info.value.code == code and str(info.value)


def test_good_json_within_the_limits():
    assert parse_json('{"a": [1, 2.5, "é", null, true]}', max_bytes=1024) == {"a": [1, 2.5, "é", None, True]}
    nested = '{"a": ' * 31 + "1" + "}" * 31
    assert parse_json(nested, max_bytes=1024, max_depth=32) is not None
