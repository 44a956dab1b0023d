"""What the README tells a user to run does what it says."""

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_test_command_reports_how_many_passed(tmp_path):
    """The README's ``python -m pytest ...`` under pyproject's pytest options (its ``addopts``) ends with pytest's
    ``N passed`` line (``-q`` twice, once from each, is ``-qq``: no such line)."""
    (command,) = re.findall(r"&& (python -m pytest[^\n`]*)", (ROOT / "README.md").read_text(encoding="utf-8"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_one.py").write_text("def test_one():\n    pass\n", encoding="utf-8")
    args = shlex.split(command)[3:]
    result = subprocess.run([sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^1 passed in ", result.stdout, re.MULTILINE), result.stdout
