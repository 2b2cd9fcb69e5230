"""Find, validate and read a checkpoint directory in the official layout.

The layout is the one of moonshotai/Kimi-Audio-7B-Instruct (config.json, safetensors shards
with model.safetensors.index.json or one model.safetensors, tiktoken.model,
tokenizer_config.json, whisper-large-v3/, audio_detokenizer/, vocoder/) plus a
THUDM/glm-4-voice-tokenizer directory. File names and tensor names are used unchanged.
Every problem is a CheckpointError naming the file and what was expected.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import torch

from kimiaudio.errors import CheckpointError


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


def safetensors_files(directory: Path) -> list[Path]:
    """The weight files of a HF-style directory: the shards of the index, or model.safetensors."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: expected a non-empty 'weight_map'")
        files = [directory / name for name in dict.fromkeys(weight_map.values())]
    else:
        files = [directory / "model.safetensors"]
    for file in files:
        if not file.is_file():
            raise CheckpointError(f"{file}: missing (named by the checkpoint's index)" if index.is_file() else f"{file}: missing")
    return files


def load_safetensors(
    directory: Path,
    keep: Iterable[str] | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    progress: bool = False,
) -> dict[str, torch.Tensor]:
    """Read every tensor (or only names starting with one of `keep`) of a directory."""
    from safetensors import SafetensorError, safe_open

    prefixes = tuple(keep) if keep is not None else None
    files = safetensors_files(Path(directory))
    state: dict[str, torch.Tensor] = {}
    bar = _progress(files, f"loading {Path(directory).name}", progress)
    for file in bar:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    if prefixes is not None and not name.startswith(prefixes):
                        continue
                    tensor = f.get_tensor(name)
                    if dtype is not None and tensor.is_floating_point():
                        tensor = tensor.to(dtype)
                    state[name] = tensor.to(device)
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise CheckpointError(f"{file}: not a readable safetensors file ({exc})") from None
    return state


def load_torch_file(path: Path, key: str | None = None) -> dict[str, torch.Tensor]:
    """torch.load a .pt file safely (weights_only) and return `obj[key]` (or the whole dict)."""
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except Exception as exc:  # torch raises many types for a corrupt or foreign file
        raise CheckpointError(f"{path}: not a readable PyTorch weights file ({type(exc).__name__}: {exc})") from None
    if key is not None:
        if not isinstance(obj, dict) or key not in obj:
            raise CheckpointError(f"{path}: expected a dict with key {key!r}")
        obj = obj[key]
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a state dict")
    return obj


def load_into(module: torch.nn.Module, state: dict[str, torch.Tensor], source: Path, ignore: tuple[str, ...] = ()) -> None:
    """Copy `state` into `module` by name; every parameter must be present with its shape.

    Names matching `ignore` (substring) are skipped, e.g. rotary inv_freq buffers that the
    official code recomputes. Extra names are an error too: they mean a layout mismatch.
    """
    own = module.state_dict()
    missing = [name for name in own if name not in state]
    unexpected = [name for name in state if name not in own and not any(i in name for i in ignore)]
    if missing:
        raise CheckpointError(f"{source}: missing tensor {missing[0]!r} ({len(missing)} missing in all)")
    if unexpected:
        raise CheckpointError(f"{source}: unexpected tensor {unexpected[0]!r} ({len(unexpected)} unexpected in all)")
    for name, target in own.items():
        if tuple(state[name].shape) != tuple(target.shape):
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {tuple(state[name].shape)}, expected {tuple(target.shape)}"
            )
    with torch.no_grad():
        for name, target in own.items():
            target.copy_(state[name].to(dtype=target.dtype))


def _progress(items: list, desc: str, enabled: bool):
    if not enabled or len(items) < 2:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="file")


