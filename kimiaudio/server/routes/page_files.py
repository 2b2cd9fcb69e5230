"""The demo page's files: they ship inside the package (package data), so any install serves
them, and a start without them (a package installed without its data files) is refused."""

from __future__ import annotations

from pathlib import Path

from kimiaudio.errors import KimiAudioError

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"


def check_page_files() -> None:
    """KimiAudioError if the page itself is missing."""
    if not (STATIC_DIR / "index.html").is_file():
        raise KimiAudioError(
            f"{STATIC_DIR / 'index.html'}: demo page not found; the package was installed "
            "without its data files (reinstall with `pip install .`)"
        )
