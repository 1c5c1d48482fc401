"""The README's first command runs the main job (`sealsync demo`); this keeps it true at every
commit."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert block is not None, "the README opens with a sh block of the two commands"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_the_two_commands() -> None:
    setup_and_run, setup_and_test = readme_commands()
    assert setup_and_run.endswith("/sealsync demo")
    assert setup_and_test.endswith("-m pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert setup_and_test in ci, ".ci/run runs exactly the README's test command"


def test_the_main_job_converges() -> None:
    """`sealsync demo`: a real relay on loopback, two devices, offline edits, a conflict."""
    result = subprocess.run(
        [sys.executable, "-m", "clients.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "converged: yes"


def test_the_python_example_converges() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "converge.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "converged" in result.stdout.splitlines()[-2]


def test_the_readme_python_example_runs(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    (example,) = re.findall(r"```python\n(.*?)```", text, re.S)
    script = tmp_path / "example.py"
    script.write_text(example)
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "write this down:" in result.stdout
