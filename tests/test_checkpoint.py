"""Checkpoint discovery and loading: sharded weights, text-only mode, one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from kimiaudio.audio.glm4_tokenizer import Glm4SpeechTokenizer
from kimiaudio.audio.whisper_features import WhisperFeatureEncoder
from kimiaudio.checkpoint.files import load_safetensors
from kimiaudio.checkpoint.paths import find_checkpoint
from kimiaudio.checkpoint.tensor_check import TensorCheck
from kimiaudio.errors import CheckpointError
from kimiaudio.models.bigvgan import load_vocoder
from kimiaudio.models.dit import load_dit
from kimiaudio.models.kimia_lm import load_lm

from helpers.cli import assert_one_line_error, kimiaudio
from helpers.lm_golden import forward_logits

SPEECH = Path(__file__).parent / "data" / "speech_hello_16k.wav"


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
    (sharded / "vocoder" / "config.json").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="vocoder/config.json: a directory, not a file"):
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


def _set_key(file, dotted: str, value) -> None:
    """Set `dotted` ("model.dit.mlp_ratio") in a JSON or YAML config file."""
    is_yaml = file.suffix == ".yaml"
    data = yaml.safe_load(file.read_text()) if is_yaml else json.loads(file.read_text())
    *parents, key = dotted.split(".")
    inner = data
    for part in parents:
        inner = inner[part]
    inner[key] = value
    file.write_text(yaml.safe_dump(data) if is_yaml else json.dumps(data))


def _load_part(root, part: str) -> None:
    """Load one part of the checkpoint at `root` as the model stack does."""
    cpu = torch.device("cpu")
    paths = find_checkpoint(root)
    if part == "whisper-large-v3":
        WhisperFeatureEncoder.load(paths)
    elif part == "glm-4-voice-tokenizer":
        Glm4SpeechTokenizer.load(paths)
    elif part == "audio_detokenizer":
        load_dit(paths.detokenizer, cpu, torch.float32)
    elif part == "vocoder":
        load_vocoder(paths.vocoder, cpu, torch.float32)
    else:
        load_lm(paths, cpu, torch.float32)


@pytest.mark.parametrize(
    "file,key,bad",
    [
        ("whisper-large-v3/config.json", "d_model", "64"),
        ("whisper-large-v3/config.json", "d_model", -64),
        ("whisper-large-v3/config.json", "encoder_attention_heads", 3),  # does not divide d_model
        ("whisper-large-v3/config.json", "activation_function", "bogus"),
        ("whisper-large-v3/preprocessor_config.json", "hop_length", "abc"),
        ("whisper-large-v3/preprocessor_config.json", "n_fft", None),
        ("glm-4-voice-tokenizer/config.json", "d_model", "abc"),
        ("glm-4-voice-tokenizer/config.json", "d_model", None),
        ("glm-4-voice-tokenizer/config.json", "pooling_kernel_size", "4"),
        ("glm-4-voice-tokenizer/config.json", "activation_function", "bogus"),
        ("glm-4-voice-tokenizer/config.json", "encoder_attention_heads", 3),
        ("audio_detokenizer/config.yaml", "model.dit.rope_params.rope_base", "abc"),
        ("audio_detokenizer/config.yaml", "model.dit.mlp_ratio", -2.0),
        ("audio_detokenizer/config.yaml", "model.dit.rope_params.max_position_embeddings", 0),
        ("audio_detokenizer/config.yaml", "mel_std", 0),  # divides the mel
    ],
)
def test_bad_component_config_values_name_the_file_and_key(demo_checkpoint, tmp_path, file, key, bad):
    root = tmp_path / "broken"
    shutil.copytree(demo_checkpoint, root)
    _set_key(root / file, key, bad)
    with pytest.raises(CheckpointError) as info:
        _load_part(root, file.split("/")[0])
    message = str(info.value)
    assert message.startswith(f"{root / file}: ") and key.split(".")[-1] in message and "\n" not in message


def _write_int64_weight(root):
    state = load_file(str(root / "model.safetensors"))
    state["lm_head.weight"] = torch.ones_like(state["lm_head.weight"], dtype=torch.int64)
    save_file(state, str(root / "model.safetensors"))


@pytest.mark.parametrize(
    "file,break_it,expected",
    [
        (
            "model.safetensors.index.json",
            lambda root: (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": 5}})),
            "weight_map['a'] = 5, expected the file name of a shard",
        ),
        (
            "vocoder/model.pt",
            lambda root: (root / "vocoder/model.pt").write_bytes(bytes(range(256)) * 16),
            "not a readable PyTorch weights file (corrupt, or not a state dict)",
        ),
        (
            "audio_detokenizer/model.pt",
            lambda root: (root / "audio_detokenizer/model.pt").write_bytes(b"PK\x03\x04" + bytes(200)),
            "not a readable PyTorch weights file (corrupt, or not a state dict)",
        ),
        ("model.safetensors", _write_int64_weight, "'lm_head.weight' has dtype int64, expected a floating-point"),
    ],
)
def test_bad_weight_files_are_one_line_errors(demo_checkpoint, tmp_path, file, break_it, expected):
    """No torch advice to re-run with weights_only=False: for a corrupt file it is wrong, and unsafe."""
    root = tmp_path / "broken"
    shutil.copytree(demo_checkpoint, root)
    break_it(root)
    with pytest.raises(CheckpointError) as info:
        _load_part(root, file.split("/")[0])
    message = str(info.value)
    assert message.startswith(f"{root / file}: ") and expected in message, message
    assert "\n" not in message and "weights_only" not in message


def test_integer_tensors_are_refused_only_where_the_module_holds_floats(tmp_path):
    module = torch.nn.Linear(2, 2)
    module.register_buffer("steps", torch.zeros((), dtype=torch.long))  # an integer buffer stays loadable
    check = TensorCheck(module, "m.pt")
    assert check.admit("steps", torch.ones((), dtype=torch.int32))
    assert check.admit("bias", torch.zeros(2, dtype=torch.bfloat16))
    with pytest.raises(CheckpointError, match=r"^m\.pt: tensor 'weight' has dtype bool, expected a floating-point"):
        check.admit("weight", torch.zeros(2, 2, dtype=torch.bool))


@pytest.mark.slow
def test_a_bad_component_config_is_one_cli_line(demo_checkpoint, tmp_path):
    root = tmp_path / "broken"
    shutil.copytree(demo_checkpoint, root)
    _set_key(root / "whisper-large-v3/preprocessor_config.json", "hop_length", "abc")
    result = kimiaudio("transcribe", "--model", str(root), "--device", "cpu", str(SPEECH))
    assert_one_line_error(result, f"{root}/whisper-large-v3/preprocessor_config.json: hop_length: expected an integer")
