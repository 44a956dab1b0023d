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


def readme_commands() -> list[str]:
    """Every ``zhie ...`` command in the README's shell blocks: continuation lines joined, comments dropped, one
    command per ``&&``/``|``/``;`` piece."""
    commands, language, lines = [], None, []
    for line in (ROOT / "README.md").read_text(encoding="utf-8").split("\n"):
        if line.startswith("```"):
            if language is None:
                language, lines = line[3:].strip(), []
            else:
                if language in ("bash", "sh", "shell", "console"):
                    for row in "\n".join(lines).replace("\\\n", " ").split("\n"):
                        row = re.sub(r"(^|\s)#.*$", "", row)
                        commands += [p.strip() for p in re.split(r"&&|\|\||;|\|", row) if p.strip().startswith("zhie ")]
                language = None
        elif language is not None:
            lines.append(line)
    return commands


def test_every_readme_command_parses_against_the_cli():
    from zhie.cli import build_parser

    commands = readme_commands()
    assert len(commands) >= 40, commands  # the README's usage sections: an extractor that finds none must fail
    for command in commands:
        argv = shlex.split(command)[1:]
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit as e:
            assert not e.code, f"README command does not parse: {command}"


# the README's model directories -> the tiny model of the same kind (tests/tiny_models.py)
KINDS = {"cluener": "ner-egp", "runs/ner": "ner-egp", "sxu": "cws", "cmeie": "re", "stsb": "similarity",
         "runs/sts": "similarity", "runs/mt": "multitask"}


def test_the_cheap_readme_commands_run_on_tiny_models(tmp_path):
    """``zhie predict|segment|embed`` as the README writes them (texts on the command line or in a file), with its model
    directory replaced by a tiny model of the same kind: each exits 0 and writes its output."""
    from tests.tiny_models import trained

    ran = 0
    for command in readme_commands():
        argv = shlex.split(command)[1:]
        kind = next((k for name, k in KINDS.items() if name in argv[1]), None) if len(argv) > 1 else None
        if argv[0] not in ("predict", "segment", "embed") or kind is None or "--ray" in argv or "-" in argv \
                or "--precision" in argv:
            continue
        argv[1] = str(trained(kind))
        for flag in ("--input",):
            if flag in argv:
                (tmp_path / argv[argv.index(flag) + 1]).write_text("王伟在青山市工作。\n\n上海市体育局召开会议。\n",
                                                                 encoding="utf-8")
        result = subprocess.run([sys.executable, "-m", "zhie", *argv], cwd=tmp_path, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, f"{command}\n{result.stderr}"
        output = argv[argv.index("--output") + 1] if "--output" in argv else None
        assert (tmp_path / output).exists() if output else result.stdout.strip(), command
        ran += 1
    assert ran >= 8, ran
