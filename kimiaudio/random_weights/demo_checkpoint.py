"""Write the tiny random-weight demo checkpoint, in exactly the official layout.

Same file names, config keys and tensor names as moonshotai/Kimi-Audio-7B-Instruct (plus a
glm-4-voice-tokenizer/ directory, as THUDM/glm-4-voice-tokenizer has it), so the demo runs
through the same loaders as the real model; only the sizes are tiny (shapes.DEMO). The
configs are config_files.py's, the tensors the same generators the benches build their
in-memory stacks from (modules.py). Every value comes from a seeded torch.Generator (one per
part), so the same seed gives byte-identical files. The weights are random: the demo speaks
noise. `DEMO_MARKER` in the root says so.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from kimiaudio.checkpoint.paths import DEMO_MARKER, find_checkpoint
from kimiaudio.errors import CheckpointError, KimiAudioError
from kimiaudio.random_weights import encoders, lm, speech_output
from kimiaudio.random_weights.config_files import (
    DETOKENIZER_DIR,
    GLM_DIR,
    VOCODER_DIR,
    WHISPER_DIR,
    write_config_files,
    write_json,
)
from kimiaudio.random_weights.shapes import DEMO

GENERATOR_VERSION = 2  # bump when the written weights change: older demo checkpoints are rewritten
DEMO_DIR_NAME = "demo-checkpoint"


SEEDS = range(0, 1 << 32)  # every part's generator is seeded with seed * 1009 + part: 64 bits hold it


def write_demo_checkpoint(out_dir: str | Path, seed: int = 0, progress: bool = False) -> Path:
    """Write every file of the demo checkpoint into `out_dir` (created; must be empty). The
    files are written beside it and moved in once all are written, so a failure or an
    interrupt leaves `out_dir` empty, never a checkpoint that looks whole but is not."""
    if seed not in SEEDS:
        raise KimiAudioError(f"--seed {seed}: expected an integer from 0 to {SEEDS[-1]}")
    out = Path(out_dir)
    if out.resolve() == Path.cwd().resolve():  # `.`, or "$DIR" with the variable unset
        raise KimiAudioError(
            f"{str(out_dir)!r}: the current directory; the demo checkpoint is moved into its directory "
            "once written, so name one of its own (e.g. ckpt)"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way, no permission
        raise KimiAudioError(
            f"{out}: cannot be made a directory for the demo checkpoint ({exc.strerror or exc})"
        ) from None
    if any(out.iterdir()):
        raise KimiAudioError(f"{out}: not empty; the demo checkpoint is written into an empty directory")
    _write_beside(out, seed, progress)
    return out


def ensure_demo_checkpoint(data_dir: str | Path, seed: int = 0, progress: bool = False) -> Path:
    """`data_dir/demo-checkpoint`, written once (beside it, then renamed, so a crash never
    leaves a half-written checkpoint behind) and reused when complete."""
    target = Path(data_dir) / DEMO_DIR_NAME
    if is_current(target):
        return target
    if _is_complete(target):
        shutil.rmtree(target)  # our own random weights from an older writer: replace them
    if target.exists():
        raise CheckpointError(
            f"{target}: incomplete demo checkpoint (no {DEMO_MARKER}); delete the directory to rewrite it"
        )
    hint = "; set another data directory (--data-dir, storage.data_dir)"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file where the directory goes, no permission, a read-only disk
        raise CheckpointError(_cannot_write(target, exc) + hint) from None
    try:
        _write_beside(target, seed, progress, hint)
    except OSError:
        if not _is_complete(target):  # not another process that finished first
            raise
    return target


def _cannot_write(target: Path, exc: OSError) -> str:
    return f"{target.parent}: the demo checkpoint cannot be written there ({exc.strerror or exc})"


def _write_beside(target: Path, seed: int, progress: bool, hint: str = "") -> None:
    """Write the checkpoint into a temporary directory next to `target` (absent or empty),
    then rename it to `target`: one step that either happens whole or not at all."""
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    except OSError as exc:  # no permission, a read-only disk
        raise CheckpointError(_cannot_write(target, exc) + hint) from None
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the checkpoint is ordinary data
    try:
        steps = [_write_configs, _write_lm, _write_whisper, _write_glm, _write_detokenizer, _write_vocoder]
        try:
            for step in _progress([*steps, _write_marker], progress):
                step(tmp, seed)
        except OSError as exc:  # a full disk, a quota
            raise CheckpointError(_cannot_write(target, exc) + hint) from None
        os.replace(tmp, target)  # replaces an empty directory
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def is_current(root: Path) -> bool:
    """True when `root` holds a complete demo checkpoint of this writer's version, which
    `ensure_demo_checkpoint` uses as it is (False: it would write one)."""
    return _is_complete(root) and _generator_version(root) == GENERATOR_VERSION


def _generator_version(root: Path) -> int | None:
    try:
        return json.loads((root / DEMO_MARKER).read_text()).get("generator_version")
    except (OSError, ValueError, AttributeError):
        return None


def _is_complete(root: Path) -> bool:
    if not (root / DEMO_MARKER).is_file():
        return False
    try:
        find_checkpoint(root)
    except CheckpointError:
        return False
    return True


def _write_configs(out: Path, seed: int) -> None:
    write_config_files(out, DEMO)


def _write_lm(out: Path, seed: int) -> None:
    _save_safetensors(lm.lm_tensors(seed, lm.lm_config(DEMO)), out / "model.safetensors")


def _write_whisper(out: Path, seed: int) -> None:
    tensors = encoders.whisper_tensors(seed, encoders.whisper_config(DEMO))
    _save_safetensors(tensors, out / WHISPER_DIR / "model.safetensors")


def _write_glm(out: Path, seed: int) -> None:
    _save_safetensors(encoders.glm_tensors(seed, DEMO), out / GLM_DIR / "model.safetensors")


def _write_detokenizer(out: Path, seed: int) -> None:
    _save_torch({"state_dict": speech_output.dit_tensors(seed, DEMO)}, out / DETOKENIZER_DIR / "model.pt")


def _write_vocoder(out: Path, seed: int) -> None:
    _save_torch({"generator": speech_output.vocoder_tensors(seed, DEMO)}, out / VOCODER_DIR / "model.pt")


# ---- marker and file helpers --------------------------------------------------------------


def _write_marker(out: Path, seed: int) -> None:
    marker = {
        "kind": "kimiaudio demo checkpoint",
        "random_weights": True,
        "message": (
            "Tiny random-weight checkpoint in the official Kimi-Audio-7B-Instruct layout, for trying the server "
            "without the 20 GB download. Its replies are random tokens: the text is gibberish and the speech is noise."
        ),
        "use_real_weights": (
            "Download moonshotai/Kimi-Audio-7B-Instruct and THUDM/glm-4-voice-tokenizer, then run "
            "`python -m kimiaudio serve --model /path/to/Kimi-Audio-7B-Instruct` or set [model] path (and "
            "glm_tokenizer_path) in config.toml."
        ),
        "seed": seed,
        "generator_version": GENERATOR_VERSION,
        "tuning": {
            "mimo_output_msg_end_row_scale": lm.MSG_END_ROW_SCALE,
            "lm_head_text_eos_row_scale": lm.TEXT_EOS_ROW_SCALE,
            "why": (
                "the mimo_output row of <|im_msg_end|> is scaled so that, with the default sampling, speech "
                "replies end after about 20-80 audio tokens (a few seconds) instead of running to the length limit; "
                "the lm_head row of <|im_kimia_text_eos|> likewise, so text answers end"
            ),
        },
    }
    write_json(out / DEMO_MARKER, marker)


# The writers' own exceptions for a file they could not write (a full disk): an OSError naming
# the file, as a failed write of the other files is.
def _save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})
    except SafetensorError as exc:  # ("Error while serializing: I/O error: No space left on device")
        raise OSError(f"{path.name}: {exc}") from None


def _save_torch(obj: dict, path: Path) -> None:
    try:
        torch.save(obj, str(path))
    except RuntimeError as exc:  # (its writer's "file write failed", or where the write stopped)
        raise OSError(f"{path.name}: {exc}") from None


def _progress(steps: list, enabled: bool):
    if not enabled:
        return steps
    from tqdm import tqdm

    return tqdm(steps, desc="writing demo checkpoint", unit="part")
