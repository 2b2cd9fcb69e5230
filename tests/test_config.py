"""Settings as config.toml documents them: its defaults are the code's, each documented range
holds at its edges and refuses the first value past them, a bad key or value names the file
and the key and says what was expected, and the rules between settings hold.

The ranges below are copied from config.toml's comments, not read from the code's
declarations, so a wrong declaration fails here."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
from pathlib import Path

import pytest

from kimiaudio.config import Config, DetokConfig, apply_overrides, check_setting, load_config
from kimiaudio.config.chunk_schedule import ChunkSchedule
from kimiaudio.engine.sampling_params import RequestRandom, SamplingParams
from kimiaudio.errors import ConfigError, KimiAudioError
from kimiaudio.server.session.client_events import ProtocolError, SessionUpdate, parse_client_event
from kimiaudio.server.session.session_objects import ga_session
from kimiaudio.server.session.session_settings import SessionSettings
from kimiaudio.server.session.session_update import AnswerUpdate, TurnUpdate

CONFIG_TOML = Path(__file__).resolve().parents[1] / "config.toml"

# key: its range as config.toml writes it ("a..b" and [a, b] include both ends, (a excludes a).
DOCUMENTED_RANGES = {
    "sampling.text_temperature": ">= 0",
    "sampling.audio_top_k": "0..1048576",
    "sampling.audio_repetition_penalty": "> 0",
    "sampling.text_repetition_window": "1..8192",
    "sampling.max_new_tokens": "0..1048576",
    "sampling.text_top_p": "(0, 1]",
    "sampling.audio_top_p": "(0, 1]",
    "sampling.text_presence_penalty": "[-2, 2]",
    "sampling.text_frequency_penalty": "[-2, 2]",
    "sampling.seed": "0..18446744073709551615",  # 0..2^64-1
    "audio.max_input_seconds": "(0, 3600]",
    "audio.silence_peak": "[0, 1)",
    "audio.encode_batch_size": "1..256",
    "detok.first_look_ahead_tokens": "0..511",
    "detok.first_ode_steps": "2..1000",
    "detok.max_chunk_tokens": "1..512",
    "detok.chunk_growth": "1.0..16.0",
    "detok.max_kv_cache_frames": "1..65536",
    "detok.max_batch_sessions": "1..1024",
    "detok.run_ahead_s": "[0, 600]",
    "engine.num_kv_blocks": "0..16777216",
    "engine.max_num_seqs": "1..4096",
    "engine.max_prefill_tokens_while_decoding": "1..1048576",
    "engine.cpu_threads": "0..1024",
    "server.port": "1..65535",
    "server.max_sessions": "1..4096",
    "server.body_timeout_s": "(0, 3600]",
    "vad.threshold": "(0, 1)",
    "vad.silence_ms": "0..60000",
    "voices.max_prompt_chunks": "0..64",
    "voices.min_seconds": "0.5..600",
}


def _edges(spec: str, kind: type) -> tuple[list, list]:
    """(values the range takes at its ends, the first values past them)."""

    def number(text: str):
        return kind(float(text)) if kind is float else int(text)

    def beside(value, direction: int):
        return math.nextafter(value, direction * math.inf) if kind is float else value + direction

    if spec.startswith((">=", ">")):
        low = number(spec.lstrip(">= "))
        return ([beside(low, +1)], [low]) if spec[1] != "=" else ([low], [beside(low, -1)])
    match = re.fullmatch(r"([\[(]?)(.+?)(?:\.\.|, )(.+?)([\])]?)", spec)
    opening, low, high, closing = match[1], number(match[2]), number(match[3]), match[4]
    takes, refuses = [], []
    for end, is_open, outward in ((low, opening == "(", -1), (high, closing == ")", +1)):
        takes.append(beside(end, -outward) if is_open else end)
        refuses.append(end if is_open else beside(end, outward))
    return takes, refuses


@pytest.mark.parametrize("name", DOCUMENTED_RANGES)
def test_each_documented_range_takes_its_edges_and_refuses_the_next_value(name):
    section, key = name.split(".")
    kind = type(getattr(getattr(Config(), section), key))
    takes, refuses = _edges(DOCUMENTED_RANGES[name], kind)
    for value in takes:
        assert check_setting(section, key, value) == value
    for value in refuses:
        with pytest.raises(ConfigError, match=rf"^{section}\.{key}: expected .+, got {re.escape(repr(value))}$"):
            apply_overrides(Config(), {section: {key: value}})


@pytest.mark.parametrize(
    "name, takes, refuses",
    [
        ("engine.block_size", [1, 2, 16, 256], [0, 3, 24, 512]),  # a power of two, 1..256
        ("model.device", ["auto", "cpu", "cuda", "cuda:1"], ["gpu", "cuda:", "CPU", ""]),
        ("model.dtype", ["auto", "float32", "bfloat16", "float16"], ["fp16", "int8"]),
        ("detok.preset", ["low_latency", "official"], ["fast", "Official"]),
        ("audio.whisper_window", ["official", "speech"], ["30s", "Speech", ""]),
        ("server.ice_servers", [["stun:h:3478", "turns:t.example.org"]], [["http://h"], ["stun:"]]),
        (
            "server.allowed_hosts",
            [[], ["voice.example.org", "kimi.lan:8080", "[::1]", "10.0.0.5", "*"]],
            [["https://voice.example.org"], ["voice.example.org/"], [""]],
        ),
        ("server.instance_id", ["", "gpu-node-1:8081", "pod_7.cuda-0", "a" * 128], ["-x", "a b", "a" * 129, "é"]),
        ("server.model_aliases", [[], ["whisper-1", "org/model:v2"]], [["bad name"], [""], "whisper-1", ["-x"]]),
        ("server.openai_voice", ["", "narrator", "v1.2_x"], ["bad name", "-x", "a" * 65]),
    ],
)
def test_documented_choices(name, takes, refuses):
    section, key = name.split(".")
    for value in takes:
        assert check_setting(section, key, value) == value
    for value in refuses:
        with pytest.raises(ConfigError, match=rf"^{section}\.{key}: expected "):
            check_setting(section, key, value)


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("sampling.audio_top_k", True, "an integer in [0, 1048576]"),
        ("sampling.audio_top_k", 1.0, "an integer in [0, 1048576]"),
        ("sampling.text_temperature", "0.5", "a finite number >= 0.0"),
        ("sampling.text_temperature", math.nan, "a finite number >= 0.0"),
        ("vad.barge_in", 1, "true or false"),
        ("server.ice_servers", "stun:h:3478", "a list, each item a stun:, turn: or turns: URL"),
    ],
)
def test_a_value_of_the_wrong_type_says_what_was_expected(name, value, expected):
    section, key = name.split(".")
    with pytest.raises(ConfigError) as info:
        apply_overrides(Config(), {section: {key: value}})
    assert str(info.value) == f"{name}: expected {expected}, got {value!r}"


def test_whole_numbers_are_taken_for_fractional_settings():
    config = apply_overrides(Config(), {"sampling": {"text_temperature": 1}})
    assert config.sampling.text_temperature == 1.0 and type(config.sampling.text_temperature) is float


def test_config_toml_documents_the_code_defaults():
    written = tomllib.loads(CONFIG_TOML.read_text())
    defaults = Config()
    sections = [f.name for f in dataclasses.fields(Config) if f.name != "base_dir"]
    assert sorted(written) == sorted(sections)
    for section in sections:
        assert written[section] == dataclasses.asdict(getattr(defaults, section)), section


def test_sampling_params_default_to_the_documented_sampling():
    """SamplingParams built in code sample as a server with config.toml's [sampling] does."""
    written = tomllib.loads(CONFIG_TOML.read_text())["sampling"]
    params = SamplingParams()
    assert {key: getattr(params, key) for key in written if key != "seed"} == {
        key: value for key, value in written.items() if key != "seed"
    }
    assert params.seed is None  # a fresh seed per request unless one is given
    greedy = SamplingParams.greedy()
    assert (greedy.text_temperature, greedy.audio_temperature) == (0.0, 0.0)
    assert greedy.audio.is_greedy and greedy.text.is_greedy


@pytest.mark.parametrize(
    "text, message",
    [
        ("[sampling]\naudio_top_k = -1\n", "sampling.audio_top_k: expected an integer in [0, 1048576], got -1"),
        (
            "[engine]\nblock_size = 'big'\n",
            "engine.block_size: expected one of 1, 2, 4, 8, 16, 32, 64, 128, 256, got 'big'",
        ),
        ("[vad]\nthreshold = 1.0\n", "vad.threshold: expected a finite number in (0.0, 1.0), got 1.0"),
        ("[detok]\nmax_batch_sessions = 0\n", "detok.max_batch_sessions: expected an integer in [1, 1024], got 0"),
        (
            "[vad]\nsilence = 5\n",
            "vad.silence: unknown setting (known: threshold, min_speech_ms, silence_ms, prefix_padding_ms, barge_in)",
        ),
        (
            "[nonsense]\nx = 1\n",
            "[nonsense]: unknown section (known: audio, detok, engine, model, sampling, server, storage, vad, voices)",
        ),
    ],
)
def test_a_bad_setting_in_a_file_names_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: {message}"


def test_an_unreadable_file_is_a_config_error(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[model\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: not valid TOML"):
        load_config(path)
    with pytest.raises(ConfigError, match="absent.toml: config file not found"):
        load_config(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(tmp_path))}: config file cannot be read"):
        load_config(tmp_path)  # a directory (was an internal IsADirectoryError)


def test_a_byte_order_mark_is_read_past(tmp_path):
    path = tmp_path / "c.toml"
    path.write_bytes("\ufeff[server]\nport = 9000\n".encode())
    assert load_config(path).server.port == 9000


def test_overrides_apply_on_top_of_the_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[server]\nport = 9000\nmax_sessions = 3\n")
    config = load_config(path, {"server": {"port": 9001}})
    assert (config.server.port, config.server.max_sessions) == (9001, 3)
    with pytest.raises(ConfigError, match=r"^server\.port: expected an integer in \[1, 65535\], got 0$"):
        load_config(path, {"server": {"port": 0}})


def test_a_retired_setting_is_ignored_with_a_warning_naming_the_file(tmp_path, caplog):
    """engine.memory_fraction (the KV pool's share of free memory) gave way to the memory plan:
    a config written for the earlier version still starts, and the log says what to do."""
    path = tmp_path / "c.toml"
    path.write_text("[engine]\nmemory_fraction = 0.5\nmax_num_seqs = 8\n")
    with caplog.at_level("WARNING", logger="kimiaudio.config"):
        config = load_config(path)
    assert config.engine.max_num_seqs == 8 and not hasattr(config.engine, "memory_fraction")
    (record,) = caplog.records
    assert record.getMessage().startswith(f"{path}: engine.memory_fraction: the KV pool takes what the memory plan")
    assert "bench --memory-plan" in record.getMessage() and "ignored" in record.getMessage()


def test_the_served_detokenizer_batches_at_most_the_served_sessions():
    from kimiaudio.config import served_detok

    assert served_detok(load_config(None, {"server": {"max_sessions": 8}})).max_batch_sessions == 8
    assert served_detok(load_config(None, {"server": {"max_sessions": 64}})).max_batch_sessions == 16
    config = load_config(None, {"server": {"max_sessions": 2}, "detok": {"ode_steps": 12}})
    assert served_detok(config) == dataclasses.replace(config.detok, max_batch_sessions=2)


# The rules between settings: each names the key it refuses and the one it is held to.
@pytest.mark.parametrize(
    "refused, taken, message",
    [
        (
            {"first_chunk_tokens": 2},
            {"first_chunk_tokens": 3},  # first_look_ahead_tokens = 2
            "detok.first_chunk_tokens = 2: expected more than first_look_ahead_tokens (2)",
        ),
        (
            {"min_ode_steps": 17},
            {"min_ode_steps": 16},  # ode_steps = 16
            "detok.min_ode_steps = 17: expected at most ode_steps (16)",
        ),
        (
            {"first_look_ahead_tokens": 0, "chunk_tokens": 4},
            {"first_look_ahead_tokens": 0, "chunk_tokens": 5},
            "detok.chunk_tokens = 4: expected more than look_ahead_tokens - first_look_ahead_tokens (4)",
        ),
        (
            {"max_chunk_tokens": 7},
            {"max_chunk_tokens": 8},  # chunk_tokens = 8
            "detok.max_chunk_tokens = 7: expected >= chunk_tokens (8)",
        ),
    ],
)
def test_chunk_schedule_rules(tmp_path, refused, taken, message):
    path = tmp_path / "c.toml"
    path.write_text("[detok]\n" + "".join(f"{k} = {v}\n" for k, v in refused.items()))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: {re.escape(message)}"):
        load_config(path)
    path.write_text("[detok]\n" + "".join(f"{k} = {v}\n" for k, v in taken.items()))
    load_config(path)


def test_the_largest_chunk_must_fit_the_dit_positions():
    # Defaults: chunks grow to max_chunk_tokens = 40 with 4 look-ahead tokens carried in: 4 x 44 frames.
    assert ChunkSchedule.from_config(DetokConfig(), 176).max_chunk_tokens == 40
    with pytest.raises(ConfigError, match=r"^detok\.max_chunk_tokens = 40: expected chunks of at most 175 frames"):
        ChunkSchedule.from_config(DetokConfig(), 175)


def test_the_official_preset_replaces_the_per_chunk_values(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[detok]\npreset = "official"\nmin_ode_steps = 20\n')  # above ode_steps: ignored here
    schedule = ChunkSchedule.from_config(load_config(path).detok, 4096)
    assert [schedule.tokens(i) for i in range(3)] == [30, 30, 30]
    assert (schedule.look_ahead(0), schedule.look_ahead(1), schedule.steps(0), schedule.steps(1)) == (12, 12, 30, 30)
    assert (schedule.min_ode_steps, schedule.lower_first_chunk, schedule.max_kv_cache_frames) == (30, False, 900)


def test_a_detok_config_built_in_code_is_held_to_the_documented_ranges():
    with pytest.raises(ConfigError, match=r"^detok\.first_ode_steps: expected an integer in \[2, 1000\], got 1$"):
        ChunkSchedule.from_config(DetokConfig(first_ode_steps=1), 4096)


def test_voice_lengths_are_ordered():
    with pytest.raises(
        ConfigError, match=r"^voices\.min_seconds = 31\.0: expected at most voices\.max_seconds \(30\.0\)$"
    ):
        apply_overrides(Config(), {"voices": {"min_seconds": 31.0}})
    assert apply_overrides(Config(), {"voices": {"min_seconds": 30.0}}).voices.min_seconds == 30.0


def test_sampling_params_built_in_code_are_held_to_the_documented_ranges():
    with pytest.raises(ConfigError, match=r"^sampling\.audio_top_k: expected an integer in \[0, 1048576\], got -1$"):
        SamplingParams(audio_top_k=-1)
    with pytest.raises(ConfigError, match=r"^sampling\.ignore_eos: expected true or false, got 'yes'$"):
        SamplingParams(ignore_eos="yes")
    with pytest.raises(ConfigError, match=r"^seed: expected an integer in \[0, 18446744073709551615\], got -1$"):
        RequestRandom(-1)


def test_the_largest_seed_reaches_the_generator():
    assert RequestRandom(2**64 - 1).seed == 2**64 - 1
    assert RequestRandom(0).next_uniforms() != RequestRandom(1).next_uniforms()
    assert RequestRandom(7).next_uniforms() == RequestRandom(7).next_uniforms()


def _update(session: dict) -> SessionUpdate:
    return parse_client_event(json.dumps({"type": "session.update", "session": session}))


@pytest.mark.parametrize(
    "session, message",
    [
        ({"sampling": {"seed": -1}}, "session.sampling.seed: expected an integer in [0, 18446744073709551615], got -1"),
        (
            {"sampling": {"audio_temperature": True}},
            "session.sampling.audio_temperature: expected a finite number >= 0.0, got True",
        ),
        ({"vad": {"silence_ms": 60001}}, "session.vad.silence_ms: expected an integer in [0, 60000], got 60001"),
        ({"sampling": {"nonsense": 1}}, "session.sampling.nonsense: unknown setting"),
        (  # a turn_detection beside it sets the threshold too, after the client's own is checked
            {"vad": {"threshold": "junk"}, "turn_detection": {"type": "server_vad", "threshold": 0.5}},
            "session.vad.threshold: expected a finite number in (0.0, 1.0), got 'junk'",
        ),
        (  # OpenAI's name for it, not the config key it sets
            {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 7}}}},
            "session.audio.input.turn_detection.threshold: expected a finite number in (0.0, 1.0), got 7",
        ),
    ],
)
def test_a_session_update_is_checked_as_it_is_parsed(session, message):
    with pytest.raises(ProtocolError) as info:
        _update(session)
    assert info.value.code == "invalid_value" and str(info.value).startswith(message)
    if "turn_detection" in message:  # the param too is the client's field
        assert info.value.param == "session.audio.input.turn_detection.threshold"


@pytest.mark.parametrize(
    "event, param",
    [
        ({"type": "session.update", "session": {"type": "realtime", "audio": {"bogus": 1}}}, "session.audio.bogus"),
        ({"type": "response.create", "response": {"audio": {"input": {}}}}, "response.audio.input"),
    ],
)
def test_a_field_the_audio_objects_do_not_have_is_refused(event, param):
    with pytest.raises(ProtocolError) as info:
        parse_client_event(json.dumps(event))
    assert (info.value.code, info.value.param) == ("unknown_parameter", param)


def test_a_parsed_session_update_applies_to_the_session_only():
    config = Config()
    settings = SessionSettings(config, can_speak=False)
    update = _update({"vad": {"threshold": 0.6}, "sampling": {"audio_temperature": 1}})
    assert update == SessionUpdate(TurnUpdate({"threshold": 0.6}), AnswerUpdate({"audio_temperature": 1.0}))
    settings.apply(update)
    assert settings.config.vad.threshold == 0.6 and settings.sampling().audio_temperature == 1.0
    assert config.vad.threshold == 0.5 and config.sampling.audio_temperature == 0.8
    # A text-only session refuses speech, and then applies nothing of the update.
    with pytest.raises(KimiAudioError, match="session.output_type"):
        settings.apply(_update({"vad": {"threshold": 0.7}, "modalities": ["text", "audio"]}))
    assert settings.config.vad.threshold == 0.6 and settings.output_type == "text"


def test_semantic_vads_eagerness_is_the_silence_it_waits():
    """semantic_vad's eagerness sets the silence that ends a turn, from the server's silence_ms;
    a silence_duration_ms named beside it wins; server_vad brings the server's back."""
    server = Config()
    settings = SessionSettings(server, can_speak=True)
    cases = [
        ({"type": "semantic_vad", "eagerness": "high"}, server.vad.silence_ms // 2, "high"),
        ({"type": "semantic_vad", "eagerness": "low"}, server.vad.silence_ms * 3, "low"),
        ({"type": "semantic_vad"}, server.vad.silence_ms, "auto"),
        ({"type": "semantic_vad", "eagerness": "low", "silence_duration_ms": 700}, 700, "low"),
    ]
    for detection, silence_ms, eagerness in cases:
        settings.apply(_update({"audio": {"input": {"turn_detection": detection}}}))
        reported = ga_session(settings, "s", None)["audio"]["input"]["turn_detection"]
        assert (settings.config.vad.silence_ms, reported["eagerness"]) == (silence_ms, eagerness), detection
    settings.apply(_update({"audio": {"input": {"turn_detection": {"type": "server_vad"}}}}))
    assert settings.config.vad.silence_ms == server.vad.silence_ms
    for detection, param in (
        ({"type": "semantic_vad", "eagerness": "eager"}, "eagerness"),
        ({"type": "server_vad", "eagerness": "high"}, "eagerness"),
    ):
        with pytest.raises(ProtocolError) as info:
            _update({"audio": {"input": {"turn_detection": detection}}})
        assert info.value.param == f"session.audio.input.turn_detection.{param}", detection


def test_openai_temperature_and_limit_reach_the_answer_sampling():
    """session.temperature samples the answer's main stream (speech, or the text of a text
    answer); a response.create's temperature and limit win for that response."""
    settings = SessionSettings(Config(), can_speak=True)
    settings.apply(_update({"temperature": 0.9, "max_response_output_tokens": 40}))
    spoken, text = settings.sampling("both"), settings.sampling("text")
    assert (spoken.audio_temperature, spoken.text_temperature, spoken.max_new_tokens) == (0.9, 0.0, 40)
    assert (text.text_temperature, text.audio_temperature) == (0.9, 0.8)
    once = settings.sampling("both", temperature=0.7, max_new_tokens=3)
    assert (once.audio_temperature, once.max_new_tokens) == (0.7, 3)
    assert ga_session(settings, "s", None)["temperature"] == 0.9
    # "inf" lifts a limit: for one response, then for the session (0 = the official limit).
    create = parse_client_event('{"type": "response.create", "response": {"max_output_tokens": "inf"}}')
    assert settings.sampling("both", max_new_tokens=create.max_new_tokens).max_new_tokens == 0
    assert ga_session(settings, "s", None)["max_output_tokens"] == 40
    settings.apply(_update({"max_output_tokens": "inf"}))
    assert settings.sampling("both").max_new_tokens == 0
    assert ga_session(settings, "s", None)["max_output_tokens"] == "inf"


def test_session_objects_report_the_tool_choice_speed_and_noise_reduction_set():
    """What a session.update set is what session.updated reports, in both shapes: tool_choice as
    set (no tool is called either way), speed, and the noise reduction (null once off)."""
    from kimiaudio.server.session.session_objects import beta_session

    settings = SessionSettings(Config(), can_speak=True)
    settings.apply(
        _update({"tool_choice": "none", "speed": 1.25, "input_audio_noise_reduction": {"type": "far_field"}})
    )
    ga, beta = ga_session(settings, "s", None), beta_session(settings, "s", None)
    assert (ga["tool_choice"], ga["audio"]["output"]["speed"], ga["audio"]["input"]["noise_reduction"]) == (
        "none",
        1.25,
        {"type": "far_field"},
    )
    assert (beta["tool_choice"], beta["speed"], beta["input_audio_noise_reduction"]) == (
        "none",
        1.25,
        {"type": "far_field"},
    )
    settings.apply(_update({"audio": {"input": {"noise_reduction": None}}}))
    assert ga_session(settings, "s", None)["audio"]["input"]["noise_reduction"] is None
    assert settings.speed == 1.25 and settings.tool_choice == "none"  # (left as they were)
