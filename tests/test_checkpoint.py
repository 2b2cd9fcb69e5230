"""Checkpoint discovery and loading: sharded weights, text-only mode, one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from kimiaudio.checkpoint.files import load_safetensors
from kimiaudio.checkpoint.paths import find_checkpoint
from kimiaudio.errors import CheckpointError
from kimiaudio.models.kimia_lm import load_lm

from helpers.lm_golden import forward_logits


def shard(checkpoint, tmp_path):
    """Copy `checkpoint` with model.safetensors split into two shards + index, as HF writes it."""
    out = tmp_path / "sharded"
    shutil.copytree(checkpoint, out)
    state = load_file(str(out / "model.safetensors"))
    (out / "model.safetensors").unlink()
    names = sorted(state)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, keys in halves.items():
        save_file({k: state[k] for k in keys}, str(out / file))
        weight_map.update({k: file for k in keys})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    return out


def test_sharded_checkpoint_loads_the_same_weights(golden_checkpoint, golden, tmp_path):
    sharded = find_checkpoint(shard(golden_checkpoint, tmp_path))
    single = find_checkpoint(golden_checkpoint)
    assert load_safetensors(sharded.root).keys() == load_safetensors(single.root).keys()
    text_a, audio_a = forward_logits(load_lm(sharded, "cpu", torch.float32), golden, "lm.text")
    torch.testing.assert_close(text_a, golden["lm.text.forward.text_logits"][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(audio_a, golden["lm.text.forward.audio_logits"][0], atol=1e-4, rtol=1e-4)


def test_missing_shard_and_missing_files_name_the_file(golden_checkpoint, tmp_path):
    sharded = shard(golden_checkpoint, tmp_path)
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors: missing"):
        load_safetensors(sharded)
    shutil.rmtree(sharded / "vocoder")
    with pytest.raises(CheckpointError, match="vocoder/config.json: missing"):
        find_checkpoint(sharded)
    assert find_checkpoint(sharded, text_only=True).text_only  # text-only needs no detokenizer files


def test_corrupt_weights_are_one_line_errors(golden_checkpoint, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(golden_checkpoint, broken)
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file") as info:
        load_lm(find_checkpoint(broken), "cpu", torch.float32)
    assert "\n" not in str(info.value)
    only_size = {"hidden_size": json.loads((golden_checkpoint / "config.json").read_text())["hidden_size"]}
    (broken / "config.json").write_text(json.dumps(only_size))
    with pytest.raises(CheckpointError, match="config.json: missing key"):
        load_lm(find_checkpoint(broken), "cpu", torch.float32)


def test_the_shipped_golden_is_found():
    """Variant a ships with the project: without it every golden test would be parametrized
    over nothing and skip silently."""
    from helpers.golden_data import DATA, GOLDEN_DIRS

    assert DATA / "golden_a" in GOLDEN_DIRS


PEAK_PROBE = """
import sys
from kimiaudio.checkpoint.files import load_torch_file

def kib(field):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field))

before = kib("VmRSS:")
state = load_torch_file(sys.argv[1], "state_dict")
assert float(state["speech_model.w"].sum()) == 64.0
print((kib("VmHWM:") - before) // 1024)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the peak from /proc")
def test_a_torch_file_reads_only_the_tensors_used(tmp_path):
    """The official detokenizer file is 19 GB, mostly not the DiT: it is memory-mapped, so a
    tensor nobody touches never enters this process's memory (peak measured in a fresh one)."""
    path = tmp_path / "model.pt"
    torch.save({"state_dict": {"speech_model.w": torch.ones(8, 8), "optimizer": torch.zeros(50_000_000)}}, path)
    out = subprocess.run(
        [sys.executable, "-c", PEAK_PROBE, str(path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    grew_mib = int(out.stdout.strip())
    assert grew_mib < 100, f"loading grew the peak by {grew_mib} MiB: the unused 191 MiB tensor was read"
