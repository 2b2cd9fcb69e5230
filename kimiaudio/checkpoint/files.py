"""Find, validate and read a checkpoint directory in the official layout.

The layout is the one of moonshotai/Kimi-Audio-7B-Instruct (config.json, safetensors shards
with model.safetensors.index.json or one model.safetensors, tiktoken.model,
tokenizer_config.json, whisper-large-v3/, audio_detokenizer/, vocoder/) plus a
THUDM/glm-4-voice-tokenizer directory. File names and tensor names are used unchanged.
Every problem is a CheckpointError naming the file and what was expected.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from kimiaudio.checkpoint.tensor_check import TensorCheck
from kimiaudio.errors import CheckpointError, ConfigError
from kimiaudio.validation import NO_BOUNDS, Bounds, check_value

# Sizes and ids of a checkpoint's configs index int32 tensors.
INT32_MAX = 2**31 - 1
POSITIVE_INT = Bounds(1, INT32_MAX)
POSITIVE_NUMBER = Bounds(min=0.0, min_open=True)


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a YAML mapping")
    return data


def config_value(config: dict[str, Any], key: str, path: Path, default: Any = ...) -> Any:
    """config[key], or a CheckpointError naming the file and the missing key."""
    if key in config:
        return config[key]
    if default is ...:
        raise CheckpointError(f"{path}: missing key {key!r}")
    return default


def checked_value(
    config: dict[str, Any],
    key: str,
    path: Path,
    expected: Any,
    bounds: Bounds = NO_BOUNDS,
    default: Any = ...,
    where: str = "",
) -> Any:
    """config[key] (or `default`) as the `expected` type in `bounds` (validation.check_value),
    or a CheckpointError `<path>: <where><key>: expected <what>, got <value>`. `where` names the
    mapping the key is in, e.g. "model.dit." """
    value = config_value(config, key, path, default)
    try:
        return check_value(where + key, value, expected, bounds)
    except ConfigError as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def safetensors_files(directory: Path) -> list[Path]:
    """The weight files of a HF-style directory: the shards of the index, or model.safetensors."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: expected a non-empty 'weight_map'")
        for name, file in weight_map.items():
            # A shard is named by its file name in the same directory, as HF writes the index.
            if not isinstance(file, str) or not file or Path(file).name != file:
                raise CheckpointError(
                    f"{index}: weight_map[{name!r}] = {file!r}, expected the file name of a shard in {directory}"
                )
        files = [directory / name for name in dict.fromkeys(weight_map.values())]
    else:
        files = [directory / "model.safetensors"]
    for file in files:
        if not file.is_file():
            raise CheckpointError(
                f"{file}: missing (named by the checkpoint's index)" if index.is_file() else f"{file}: missing"
            )
    return files


def iter_safetensors(
    directory: Path,
    keep: Iterable[str] | None = None,
    dtype: torch.dtype | None = None,
    progress: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors (or only names starting with one of `keep`) of a directory, one at a time in
    file order, each read when asked for: a caller that places them as they come (models.
    kimia_lm.assemble_lm) never holds the whole checkpoint in host memory."""
    from safetensors import SafetensorError, safe_open

    prefixes = tuple(keep) if keep is not None else None
    files = safetensors_files(Path(directory))
    for file in _progress(files, f"loading {Path(directory).name}", progress):
        try:
            handle = safe_open(str(file), framework="pt", device="cpu")
            names = [name for name in handle.keys() if prefixes is None or name.startswith(prefixes)]
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise CheckpointError(f"{file}: not a readable safetensors file ({exc})") from None
        with handle as f:
            for name in names:
                try:
                    tensor = f.get_tensor(name)
                except (SafetensorError, OSError, RuntimeError) as exc:
                    raise CheckpointError(f"{file}: not a readable safetensors file ({exc})") from None
                if dtype is not None and tensor.is_floating_point():
                    tensor = tensor.to(dtype)
                yield name, tensor


def load_safetensors(
    directory: Path,
    keep: Iterable[str] | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    progress: bool = False,
) -> dict[str, torch.Tensor]:
    """Every tensor (or only names starting with one of `keep`) of a directory, by name."""
    return {name: tensor.to(device) for name, tensor in iter_safetensors(directory, keep, dtype, progress)}


def load_torch_file(path: Path, key: str | None = None) -> dict[str, torch.Tensor]:
    """torch.load a .pt file safely (weights_only) and return `obj[key]` (or the whole dict).

    The file is memory-mapped where its format allows (torch's zip format), so only the tensors
    used are read: the official detokenizer's model.pt is 19 GB, most of it not the DiT's."""
    try:
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            obj = torch.load(str(path), map_location="cpu", weights_only=True)  # the legacy format
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except Exception as exc:  # torch raises many types for a corrupt or foreign file
        raise CheckpointError(
            f"{path}: not a readable PyTorch weights file (corrupt, or not a state dict): {_load_failure(exc)}"
        ) from None
    if key is not None:
        if not isinstance(obj, dict) or key not in obj:
            raise CheckpointError(f"{path}: expected a dict with key {key!r}")
        obj = obj[key]
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a state dict")
    return obj


def _load_failure(exc: Exception) -> str:
    """The part of torch.load's error that describes the file, on one line. A weights_only
    refusal comes wrapped in advice to load with weights_only=False, which would run whatever a
    corrupt or hostile file holds: only the unpickler's own reason is kept."""
    text = str(exc)
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text.split(marker, 1)[1]
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    # torch's messages go on with advice after their first sentence
    first = first.split(". ", 1)[0].rstrip(".")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def load_into(
    module: torch.nn.Module, state: dict[str, torch.Tensor], source: Path, ignore: tuple[str, ...] = ()
) -> None:
    """Copy `state` into `module` by name; every parameter must be present with its shape, and
    any other name is an error unless it matches `ignore` (checkpoint/tensor_check.py)."""
    check = TensorCheck(module, source, ignore)
    taken = [name for name, tensor in state.items() if check.admit(name, tensor)]
    check.finish()
    own = module.state_dict()
    with torch.no_grad():
        for name in taken:
            own[name].copy_(state[name].to(dtype=own[name].dtype))


def _progress(items: list, desc: str, enabled: bool):
    if not enabled or len(items) < 2:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="file")
