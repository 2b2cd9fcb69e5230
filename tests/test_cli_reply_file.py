"""`chat --out`: the reply file is whole or not there, whatever stops its write."""

from __future__ import annotations

import pytest

from helpers.cli import assert_one_line_error, kimiaudio

# Each test starts the CLI: a process importing torch and loading a model (seconds each).
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["reply.wav", "reply.mp3"])
def test_a_reply_the_disk_has_no_room_for_leaves_no_truncated_file(name, demo_checkpoint, speech_wav, tmp_path):
    """A full disk (helpers/cli.py: files limited to 512 bytes, less than any reply) is one
    line naming the file, and the file an earlier run wrote there is kept as it was."""
    out = tmp_path / name
    out.write_bytes(b"an earlier reply")
    result = kimiaudio("chat", str(speech_wav), "--model", str(demo_checkpoint), "--out", str(out), files_up_to=512)
    assert_one_line_error(result, f"{out}: cannot be written")
    assert out.read_bytes() == b"an earlier reply"
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
