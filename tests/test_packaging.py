"""The demo page ships inside the package: a non-editable install serves it from anywhere."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_carries_the_demo_page(tmp_path):
    # Built from a copy of the project's files alone: a checkout's leftover *.egg-info would
    # list the page for setuptools and hide a missing package-data declaration.
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    source = tmp_path / "src"
    for name in filter(None, listed):
        if (ROOT / name).is_file() and not name.startswith("tests/"):
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "dist").glob("kimiaudio-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for page_file in ("index.html", "app.js", "style.css"):
        assert f"kimiaudio/static/{page_file}" in names


def test_ci_runs_the_test_command_of_the_readme():
    """.ci/run installs and tests as README.md's "Run the tests" command does (pip's -q aside)."""
    import re

    readme = (ROOT / "README.md").read_text()
    block = re.search(r"Run the tests:\s*```bash\n(.+?)\n```", readme, re.S).group(1).strip()
    steps = [step.strip() for step in block.split("&&")]
    script = (ROOT / ".ci" / "run").read_text().replace("\\\n", " ")  # continued lines joined
    ci = [
        line.strip()
        for line in script.splitlines()
        if line.strip().startswith("pip install") and "python -m pytest" in line
    ]
    assert len(ci) == 1, ci
    # The same install and test steps; CI runs its tidy checks (ruff, mypy) between them.
    ci_steps = [step.strip().replace("pip install -q ", "pip install ") for step in ci[0].split("&&")]
    wanted = ("pip install", "python -m pytest")
    assert [s for s in ci_steps if s.startswith(wanted)] == [s for s in steps if s.startswith(wanted)], (ci, block)
    assert steps[-1].startswith("python -m pytest")
