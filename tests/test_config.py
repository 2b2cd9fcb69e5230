"""Settings: every config key is type- and range-checked where it enters (config file, CLI
overrides, session.update, SamplingParams built in code), with an error naming the key.

The table below is built from the dataclasses' declared bounds, so a new field is covered
without touching this file."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
import typing
from pathlib import Path

import pytest

from kimiaudio.validation import Bounds, check_fields, declared
from kimiaudio.config import Config, SamplingConfig, apply_overrides, check_setting, load_config
from kimiaudio.engine.sampling_params import RequestRandom, SamplingParams
from kimiaudio.layers.stream_sampling import StreamSampling
from kimiaudio.errors import ConfigError
from kimiaudio.server.session.client_events import ProtocolError, SessionUpdate, parse_client_event

SECTIONS = {f.name: typing.get_type_hints(Config)[f.name] for f in dataclasses.fields(Config) if f.name != "base_dir"}
FIELDS = [(section, key, expected, bounds) for section, cls in SECTIONS.items()
          for key, (expected, bounds) in declared(cls).items()]
WRONG_TYPES = {
    bool: [1, "true", None, [True]],
    int: ["1", 1.5, True, None, [1], {"n": 1}],
    float: ["1.0", True, None, [1.0], math.nan, math.inf, -math.inf],
    str: [1, None, True, ["x"], {"s": "x"}],
    list: ["stun:x", None, {"a": 1}, [1], [None]],
}


def _outside_strings(bounds: Bounds) -> list[str]:
    if bounds.choices:
        return ["not-a-choice", str(bounds.choices[0]).upper() + "x"]
    if bounds.pattern is None:
        return []
    bad = [s for s in ("", " ", "a b", "\n", "no-scheme") if not re.fullmatch(bounds.pattern, s)]
    assert bad, f"no string outside the pattern {bounds.pattern!r} was found"
    return bad


def _outside_numbers(kind: type, bounds: Bounds) -> list:
    if kind is int and bounds.choices:
        taken = set(bounds.choices)
        gap = next(v for v in range(min(taken), max(taken)) if v not in taken) if len(taken) > 1 else None
        return [v for v in (min(taken) - 1, max(taken) + 1, gap) if v is not None]
    low, high = bounds.min, bounds.max
    if kind is int and (low, high) == (None, None):
        return [2**63, -(2**63) - 1]
    values = []
    if low is not None:
        values += [low - 1, low if bounds.min_open else _next(kind, low, -1)]
    if high is not None:
        values += [high + 1, high if bounds.max_open else _next(kind, high, +1)]
    return [kind(v) for v in dict.fromkeys(values)]


def _next(kind: type, value: float, direction: int) -> float:
    """The nearest value of `kind` beyond `value` in `direction`."""
    return math.nextafter(value, direction * math.inf) if kind is float else value + direction


def bad_values(expected, bounds: Bounds) -> list:
    kind = typing.get_origin(expected) or expected
    if kind is list:
        return WRONG_TYPES[list] + [[s] for s in _outside_strings(bounds)]
    values = list(WRONG_TYPES[kind])
    values += _outside_strings(bounds) if kind is str else []
    values += _outside_numbers(kind, bounds) if kind in (int, float) else []
    return values


def good_values(expected, bounds: Bounds) -> list:
    """The edges a range includes (each must pass), or every choice."""
    if bounds.choices:
        return list(bounds.choices)
    kind = typing.get_origin(expected) or expected
    if kind not in (int, float):
        return []
    return [kind(v) for v, is_open in ((bounds.min, bounds.min_open), (bounds.max, bounds.max_open))
            if v is not None and not is_open]


BAD = [(section, key, value) for section, key, expected, bounds in FIELDS for value in bad_values(expected, bounds)]
GOOD = [(section, key, value) for section, key, expected, bounds in FIELDS for value in good_values(expected, bounds)]


@pytest.mark.parametrize("section, key, value", BAD, ids=[f"{s}.{k}={v!r}"[:60] for s, k, v in BAD])
def test_every_setting_refuses_values_outside_its_type_and_range(section, key, value):
    with pytest.raises(ConfigError, match=rf"^{section}\.{key}: expected .*, got "):
        apply_overrides(Config(), {section: {key: value}})


@pytest.mark.parametrize("section, key, value", GOOD, ids=[f"{s}.{k}={v!r}"[:60] for s, k, v in GOOD])
def test_every_setting_takes_the_edges_of_its_range(section, key, value):
    assert check_setting(section, key, value) == value


@pytest.mark.parametrize("section, key, expected, bounds", FIELDS, ids=[f"{s}.{k}" for s, k, _, _ in FIELDS])
def test_every_number_declares_its_range(section, key, expected, bounds):
    """An int needs both ends (a Python int is unbounded); a float at least one."""
    if expected is int and not bounds.choices:
        assert bounds.min is not None and bounds.max is not None
    if expected is float:
        assert (bounds.min, bounds.max) != (None, None)


def test_defaults_are_in_range_and_ints_become_floats():
    config = apply_overrides(Config(), {"sampling": {"text_temperature": 1}, "server": {"ice_servers": ["stun:h:3478"]}})
    assert config.sampling.text_temperature == 1.0 and type(config.sampling.text_temperature) is float
    assert config.server.ice_servers == ["stun:h:3478"]


def test_a_field_without_bounds_is_still_type_checked():
    @dataclasses.dataclass
    class Section:
        flag: bool = False
        count: int = 0

    check_fields(Section(True, 2**63 - 1))
    with pytest.raises(ConfigError, match="x.flag: expected true or false, got 1"):
        check_fields(Section(flag=1), "x.")
    with pytest.raises(ConfigError, match="x.count: expected a 64-bit integer"):
        check_fields(Section(count=2**63), "x.")


def test_cross_field_rule_names_both_keys_at_load():
    look_ahead = Config().detok.first_look_ahead_tokens
    with pytest.raises(ConfigError, match=rf"detok.first_chunk_tokens = {look_ahead}: expected more than "
                                          rf"first_look_ahead_tokens \({look_ahead}\)"):
        apply_overrides(Config(), {"detok": {"first_chunk_tokens": look_ahead}})
    apply_overrides(Config(), {"detok": {"first_chunk_tokens": look_ahead + 1}})
    with pytest.raises(ConfigError, match="detok.min_ode_steps"):
        apply_overrides(Config(), {"detok": {"min_ode_steps": Config().detok.ode_steps + 1}})


def test_out_of_range_top_k_in_a_file_fails_at_load(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[sampling]\naudio_top_k = -3\n")
    with pytest.raises(ConfigError, match=r"c.toml: sampling.audio_top_k: expected an integer in \[0, 1048576\], got -3"):
        load_config(path)


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, -1, "5", 5.0, True, None])
def test_a_bad_seed_is_refused_by_config_and_session_update(seed):
    with pytest.raises(ConfigError, match="sampling.seed: expected an integer in"):
        apply_overrides(Config(), {"sampling": {"seed": seed}})
    message = json.dumps({"type": "session.update", "session": {"sampling": {"seed": seed}}})
    with pytest.raises(ProtocolError, match=r"session\.sampling\.seed: expected") as info:
        parse_client_event(message)
    assert info.value.code == "invalid_value"


def test_the_largest_seed_reaches_the_generators():
    update = parse_client_event(json.dumps({"type": "session.update", "session": {"sampling": {"seed": 2**64 - 1}}}))
    config = apply_overrides(Config(), {"sampling": update.sampling})
    params = SamplingParams.from_config(config.sampling)
    assert RequestRandom(params.seed).seed == 2**64 - 1 and RequestRandom(0).next_uniforms() != RequestRandom(1).next_uniforms()
    with pytest.raises(ConfigError, match="seed"):
        RequestRandom(2**64)


@pytest.mark.parametrize("body, words", [
    ({"sampling": {"audio_temperature": True}}, "sampling.audio_temperature: expected a finite number"),
    ({"sampling": {"audio_top_k": 10**30}}, "sampling.audio_top_k: expected an integer"),
    ({"sampling": {"audio_top_k": {"k": 3}}}, "sampling.audio_top_k"),
    ({"sampling": {"nonsense": 1}}, "sampling.nonsense: unknown setting"),
    ({"vad": {"threshold": [0.5]}}, "vad.threshold"),
    ({"vad": {"silence_ms": 10**6}}, "vad.silence_ms: expected an integer in [0, 60000]"),
])
def test_session_update_values_of_the_wrong_type_are_protocol_errors(body, words):
    with pytest.raises(ProtocolError) as info:
        parse_client_event(json.dumps({"type": "session.update", "session": body}))
    assert info.value.code == "invalid_value" and words in str(info.value)


@pytest.mark.parametrize("raw", ['{"type": "session.update", "session": {"sampling": {"text_temperature": NaN}}}',
                                 '{"type": "session.update", "session": {"vad": {"threshold": 1e999}}}',
                                 '{"type": "session.update", "session": {"sampling": {"seed": ' + "9" * 5000 + "}}}",
                                 '{"type": "session.update", "session": ' + "[" * 30000 + "]" * 30000 + "}"])
def test_json_oddities_are_protocol_errors(raw):
    with pytest.raises(ProtocolError):
        parse_client_event(raw)


def test_session_update_values_come_back_checked():
    update = parse_client_event(json.dumps({"type": "session.update", "session": {"vad": {"threshold": 0.6, "silence_ms": 400},
                                                                                 "sampling": {"audio_temperature": 1}}}))
    assert update == SessionUpdate({"threshold": 0.6, "silence_ms": 400}, {"audio_temperature": 1.0})


# Every [sampling] key's bad values again, through SamplingParams built in code (seed may be None there).
SAMPLING_BAD = [(key, value) for section, key, value in BAD if section == "sampling" and not (key == "seed" and value is None)]


@pytest.mark.parametrize("key, value", SAMPLING_BAD, ids=[f"{k}={v!r}"[:60] for k, v in SAMPLING_BAD])
def test_sampling_params_built_in_code_have_the_config_ranges(key, value):
    with pytest.raises(ConfigError, match=rf"^sampling\.{key}: expected"):
        SamplingParams(**{key: value})


def test_sampling_params_and_streams_check_their_own_fields():
    with pytest.raises(ConfigError, match="^sampling.ignore_eos: expected true or false"):
        SamplingParams(ignore_eos="yes")
    config_fields = declared(SamplingConfig)
    for name, (_, bounds) in declared(StreamSampling).items():
        assert config_fields[f"text_{name}"][1] == config_fields[f"audio_{name}"][1] == bounds, name
    with pytest.raises(ConfigError, match="temperature: expected a finite number"):
        StreamSampling(temperature=math.nan)
    params = SamplingParams(seed=2**64 - 1, audio_temperature=1)
    assert SamplingParams(seed=None).seed is None and params.audio == StreamSampling(1.0, 10, 1.0, 64)
    assert type(params.audio_temperature) is float


def test_config_file_errors_name_file_and_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[engine]\nblock_size = 'big'\n")
    with pytest.raises(ConfigError, match=r"c.toml: engine.block_size: expected one of 1, 2, 4"):
        load_config(path)
    path.write_text("[nonsense]\nx = 1\n")
    with pytest.raises(ConfigError, match=r"\[nonsense\]: unknown section"):
        load_config(path)
    path.write_text("[model\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.toml")
    # Scheduling values are checked at load, even for a text-only server with no detokenizer.
    for text, key in (("max_batch_sessions = 0", "detok.max_batch_sessions"), ("run_ahead_s = -1.0", "detok.run_ahead_s")):
        path.write_text(f"[detok]\n{text}\n")
        with pytest.raises(ConfigError, match=rf"c.toml: {key}"):
            load_config(path)


def test_repository_config_toml_is_the_defaults():
    """config.toml documents every setting with its default value."""
    path = Path(__file__).resolve().parents[1] / "config.toml"
    written = tomllib.loads(path.read_text())
    repo, defaults = load_config(path), Config()
    assert set(written) == set(SECTIONS)  # every section, no stray one
    for section in SECTIONS:
        names = {f.name for f in dataclasses.fields(getattr(defaults, section))}
        assert set(written[section]) == names, section  # every key is written out, none unknown
        assert getattr(repo, section) == getattr(defaults, section), section
