"""The command line as a user runs it: `python -m kimiaudio ...` in a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile

from helpers.cli import assert_one_line_error, kimiaudio

ROOT = Path(__file__).resolve().parents[1]
# Each test starts the CLI: a process importing torch and loading a model (seconds each).
pytestmark = pytest.mark.slow


def test_chat_writes_24k_reply_and_prints_token_ids(demo_checkpoint, speech_wav, tmp_path):
    out = tmp_path / "reply.wav"
    result = kimiaudio(
        "chat",
        str(speech_wav),
        "--model",
        str(demo_checkpoint),
        "--out",
        str(out),
        "--json",
        "--seed",
        "3",
        "--max-new-tokens",
        "48",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["demo_weights"] is True
    turn = report["turns"][0]
    assert turn["audio_tokens"] and all(isinstance(t, int) for t in turn["audio_tokens"])
    assert all(isinstance(t, int) for t in turn["text_tokens"])
    for key in ("encode_s", "generate_s", "steps_per_s", "detok_rtf"):
        assert turn["timings"][key] > 0
    audio, rate = soundfile.read(out)
    assert rate == 24000
    codes = [t for t in turn["audio_tokens"] if t >= 320]  # demo checkpoint token offset: codes above it
    assert len(audio) == len(codes) * 4 * 480  # 12.5 Hz codes -> 50 Hz frames -> 480 samples each
    assert np.abs(audio).max() > 0.01


def test_chat_two_turns_same_seed_is_reproducible(demo_checkpoint, speech_wav, tmp_path):
    runs = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.wav"
        result = kimiaudio(
            "chat",
            str(speech_wav),
            str(speech_wav),
            "--model",
            str(demo_checkpoint),
            "--out",
            str(out),
            "--json",
            "--seed",
            "5",
            "--max-new-tokens",
            "40",
        )
        assert result.returncode == 0, result.stderr
        runs.append(json.loads(result.stdout))
        assert (tmp_path / f"{name}.turn1.wav").exists() and out.exists()
    assert len(runs[0]["turns"]) == 2
    assert [t["audio_tokens"] for t in runs[0]["turns"]] == [t["audio_tokens"] for t in runs[1]["turns"]]


def test_transcribe_prints_text_without_detokenizer(demo_checkpoint, speech_wav):
    result = kimiaudio("transcribe", str(speech_wav), "--model", str(demo_checkpoint), "--json")
    assert result.returncode == 0, result.stderr
    turn = json.loads(result.stdout)["turns"][0]
    assert turn["text_tokens"] and turn["finish_reason"] in ("stop", "length")
    assert turn["audio_tokens"] == []  # text output: the audio stream stays blank
    assert "detok_s" not in turn["timings"]
    plain = kimiaudio("transcribe", str(speech_wav), "--model", str(demo_checkpoint))
    assert plain.returncode == 0 and "DEMO WEIGHTS" in plain.stderr
    # The same audio and seed, the same words: the plain run prints what the JSON reported, and
    # only that (a script reads the words from stdout; the notice goes to stderr).
    assert plain.stdout == turn["text"] + "\n", (plain.stdout, turn["text"])


@pytest.mark.parametrize("kind", ["missing", "garbage", "silent", "empty"])
def test_bad_audio_input_is_one_line(kind, demo_checkpoint, tmp_path):
    path = tmp_path / f"{kind}.wav"
    if kind == "garbage":
        path.write_bytes(b"this is not audio" * 100)
    elif kind == "silent":
        soundfile.write(path, np.zeros(16000, dtype=np.float32), 16000)
    elif kind == "empty":
        soundfile.write(path, np.zeros(0, dtype=np.float32), 16000)
    result = kimiaudio("transcribe", str(path), "--model", str(demo_checkpoint))
    assert_one_line_error(result, str(path.name))


def test_too_long_input_names_the_limit(demo_checkpoint, speech_wav, tmp_path):
    config = tmp_path / "short.toml"
    config.write_text("[audio]\nmax_input_seconds = 1.0\n")
    result = kimiaudio("transcribe", str(speech_wav), "--model", str(demo_checkpoint), "--config", str(config))
    assert_one_line_error(result, "audio.max_input_seconds")


def test_bad_model_dir_and_bad_config_key(tmp_path, speech_wav):
    result = kimiaudio("transcribe", str(speech_wav), "--model", str(tmp_path / "nowhere"))
    assert_one_line_error(result, "nowhere")
    broken = tmp_path / "ckpt"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    result = kimiaudio("transcribe", str(speech_wav), "--model", str(broken))
    assert_one_line_error(result, str(broken))
    config = tmp_path / "bad.toml"
    config.write_text("[vad]\ntreshold = 0.5\n")
    result = kimiaudio("transcribe", str(speech_wav), "--config", str(config))
    assert_one_line_error(result, "vad.treshold", "bad.toml")


def test_bad_arguments_are_one_line():
    result = kimiaudio("chat")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    result = kimiaudio("bench", "--sessions", "one,two")
    assert_one_line_error(result, "--sessions")


def test_demo_checkpoint_into_a_file_is_one_line(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("a file, not a directory")
    result = kimiaudio("demo-checkpoint", str(taken))
    assert result.returncode == 2, result.stderr  # a user's error (2), not an internal one (1)
    assert_one_line_error(result, str(taken), "cannot be made a directory")


@pytest.mark.parametrize("where", [".", ""])
def test_demo_checkpoint_into_the_current_directory_is_one_line_and_writes_nothing(where, tmp_path):
    """`demo-checkpoint .` or `demo-checkpoint "$DIR"` with the variable unset, in an empty
    directory: the checkpoint, written beside its directory, cannot be moved onto the one in use."""
    result = kimiaudio("demo-checkpoint", where, cwd=tmp_path)
    assert result.returncode == 2, result.stderr  # a user's error (2), not an internal one (1)
    assert_one_line_error(result, f"{where!r}: the current directory")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("seed", ["-1", str(1 << 64)])
def test_a_seed_out_of_range_is_one_line_and_writes_nothing(seed, tmp_path):
    result = kimiaudio("demo-checkpoint", str(tmp_path / "ckpt"), "--seed", seed)
    assert_one_line_error(result, f"--seed {seed}", "from 0 to 4294967295")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["--model", "--glm-tokenizer", "--config", "--data-dir"])
def test_an_empty_path_is_one_line(flag, speech_wav):
    """`--model "$MODEL"` with the variable unset: not the current directory, not the default."""
    result = kimiaudio("transcribe", str(speech_wav), flag, "")
    assert_one_line_error(result, f"{flag}: an empty path")


def test_the_reply_is_written_in_the_format_its_name_says(demo_checkpoint, speech_wav, tmp_path):
    """--out reply.mp3 is an MP3 file (PyAV reads it as one), not a WAV under another name; a
    suffix no encoder writes is refused before the model loads."""
    import av

    out = tmp_path / "reply.mp3"
    result = kimiaudio("chat", str(speech_wav), "--model", str(demo_checkpoint), "--out", str(out), "--seed", "1")
    assert result.returncode == 0, result.stderr
    with av.open(str(out)) as container:
        assert container.format.name == "mp3" and container.streams.audio[0].sample_rate == 24000
    result = kimiaudio("chat", str(speech_wav), "--model", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r.xyz"))
    assert_one_line_error(result, f"--out {tmp_path / 'r.xyz'}: .xyz is no audio format")


def test_unusable_places_to_write_are_one_line_before_any_answer(demo_checkpoint, speech_wav, tmp_path):
    """Found before the model loads: --out a directory; a data directory that is a file (the
    demo checkpoint is written there)."""
    result = kimiaudio("chat", str(speech_wav), "--model", str(demo_checkpoint), "--out", str(tmp_path))
    assert_one_line_error(result, f"--out {tmp_path}: a directory")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    result = kimiaudio("transcribe", str(speech_wav), "--data-dir", str(a_file))
    assert_one_line_error(result, f"{a_file}: the demo checkpoint cannot be written there")


def test_an_input_that_leaves_no_room_for_the_answer_is_one_line(demo_checkpoint, speech_wav, tmp_path):
    """The official limit of a spoken answer is 1500 positions, prompt included: 125 s of speech
    (12.5 positions a second) leaves none, which the official loop answers with nothing."""
    pcm, sr = soundfile.read(str(speech_wav), dtype="float32")
    long_wav = tmp_path / "long.wav"
    soundfile.write(str(long_wav), np.resize(pcm, int(125 * sr)), sr)
    config = tmp_path / "long.toml"
    config.write_text("[audio]\nmax_input_seconds = 200.0\n")
    out = tmp_path / "r.wav"
    result = kimiaudio(
        "chat", str(long_wav), "--model", str(demo_checkpoint), "--config", str(config), "--out", str(out)
    )
    assert_one_line_error(result, "which leaves no room for a spoken answer")
    assert not out.exists()


def test_an_address_serve_cannot_listen_on_is_one_line_before_the_model_loads(tmp_path):
    """(The model named does not exist: an error about it would mean it was loaded first.)"""
    import socket

    nowhere = ["--model", str(tmp_path / "nowhere"), "--data-dir", str(tmp_path / "data")]
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = kimiaudio("serve", "--port", str(port), *nowhere)
    assert_one_line_error(result, f"cannot listen on 127.0.0.1:{port}", "is another server running?")
    result = kimiaudio("serve", "--host", "999.1.1.1", *nowhere)
    assert_one_line_error(result, "cannot listen on 999.1.1.1:8080")
    assert "another server" not in result.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["serve", "--tls-cert", "missing.pem", "--tls-key", "missing.key"],
        ["chat", "missing.wav", "--out", "reply.wav"],
        ["transcribe", "SPEECH", "--max-new-tokens", "-3"],
    ],
    ids=["serve", "chat", "transcribe"],
)
def test_a_refused_command_says_why_before_importing_torch(command, tmp_path, speech_wav):
    """What stops a command before its model loads is said before torch (seconds) is imported."""
    command = [str(speech_wav) if arg == "SPEECH" else arg for arg in command]
    result = kimiaudio(*command, cwd=tmp_path, env={"PYTHONPROFILEIMPORTTIME": "1"})
    lines = result.stderr.splitlines()
    imported = [line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")]
    said = [line for line in lines if not line.startswith("import time:")]
    assert result.returncode == 2 and len(said) == 1 and said[0].startswith("kimiaudio: error: "), said
    assert "kimiaudio.cli" in imported and "torch" not in imported


@contextlib.contextmanager
def read_only(path: Path):
    """`path` made read-only for this process: by its mode, or for root (whom modes do not stop)
    by the immutable flag."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        yield
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)]).returncode != 0:
        pytest.skip("root, and this file system takes no immutable flag")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_database_file_serve_may_not_write_is_one_line_before_the_model_loads(tmp_path):
    """(The model named does not exist: an error about it would mean it was loaded first.)"""
    from kimiaudio.store.schema import open_database

    database = tmp_path / "data" / "kimiaudio.db"
    open_database(database).close()
    with read_only(database):
        result = kimiaudio("serve", "--model", str(tmp_path / "nowhere"), "--data-dir", str(database.parent))
    assert_one_line_error(result, f"{database}: the conversation database cannot be written")


def serve_with_files_up_to(size: int, tmp_path: Path) -> subprocess.CompletedProcess:
    """`serve` on tmp_path/data, its files up to `size` bytes (a full disk, helpers/cli.py).
    (The model named does not exist: an error about it would mean it was loaded first.)"""
    nowhere = ["--model", str(tmp_path / "nowhere"), "--data-dir", str(tmp_path / "data")]
    return kimiaudio("serve", *nowhere, files_up_to=size)


def test_a_disk_with_no_room_for_the_owners_pid_is_one_line_before_the_model_loads(tmp_path):
    result = serve_with_files_up_to(0, tmp_path)
    database = tmp_path / "data" / "kimiaudio.db"
    assert_one_line_error(result, f"{database}: cannot write kimiaudio.db.owner beside it")


def test_a_database_whose_disk_is_full_is_not_called_unusable(tmp_path):
    """The file is whole, but its WAL index (-shm, 32 KiB) cannot be made: the line says what
    cannot be written, not that the file is no database, and the file keeps its conversations."""
    from kimiaudio.store.schema import open_database

    database = tmp_path / "data" / "kimiaudio.db"
    db = open_database(database)
    db.execute("INSERT INTO conversations (id, title, created_at, updated_at) VALUES ('c', 'kept', 0, 0)")
    db.close()
    result = serve_with_files_up_to(64, tmp_path)  # (room for the owner's pid, not for the -shm)
    assert_one_line_error(result, f"{database}: the conversation database", "cannot be written", "disk full?")
    assert "not a usable" not in result.stderr
    db = open_database(database)
    assert db.execute("SELECT title FROM conversations").fetchall() == [("kept",)]
    db.close()


def test_an_api_key_no_client_can_send_is_one_line_before_the_model_loads(tmp_path, monkeypatch):
    """(The model named does not exist: an error about it would mean it was loaded first.)"""
    nowhere = ["--model", str(tmp_path / "nowhere"), "--data-dir", str(tmp_path / "data")]
    monkeypatch.setenv("KIMIAUDIO_API_KEY", "two words")
    result = kimiaudio("serve", *nowhere)
    assert_one_line_error(result, "KIMIAUDIO_API_KEY: expected printable ASCII without spaces")
    monkeypatch.delenv("KIMIAUDIO_API_KEY")
    config = tmp_path / "key.toml"
    config.write_text('[server]\napi_key = "two words"\n')
    result = kimiaudio("serve", "--config", str(config), *nowhere)
    assert_one_line_error(result, "server.api_key: expected printable ASCII without spaces")


@pytest.mark.parametrize("command", ["chat", "transcribe"])
def test_sampling_flags_out_of_range_are_one_line_before_the_model_loads(command, speech_wav, tmp_path):
    """--seed and --max-new-tokens are held to their [sampling] ranges and named as the flags
    they are. (The model named does not exist: an error about it would mean it was loaded first.)"""
    nowhere = ["--model", str(tmp_path / "nowhere"), "--data-dir", str(tmp_path / "data")]
    result = kimiaudio(command, str(speech_wav), *nowhere, "--seed", "-1")
    assert_one_line_error(result, "--seed: expected an integer in [0, 18446744073709551615], got -1")
    result = kimiaudio(command, str(speech_wav), *nowhere, "--max-new-tokens", "-5")
    assert_one_line_error(result, "--max-new-tokens: expected an integer in [0, ")
