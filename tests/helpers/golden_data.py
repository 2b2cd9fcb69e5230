"""Where the tests' data lies: tests/data and the golden data sets in it."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"
# golden.safetensors as the golden data set's layout has it (docs/official-model.md, "The
# golden data set"), or xz-compressed (variant a ships so: 3 MB instead of 6.6 MB in the
# repository; every tensor in it is used by a test).
GOLDEN_FILES = ("golden.safetensors", "golden.safetensors.xz")
# Every golden folder present: variant a ships with the project; other variants (other sizes,
# flags and token ids, same layout) dropped in beside it run the same tests.
GOLDEN_DIRS = sorted(p for p in DATA.glob("golden_*") if any((p / name).is_file() for name in GOLDEN_FILES))
