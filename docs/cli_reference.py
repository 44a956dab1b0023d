"""The flag tables of ``docs/training/configuration.md``, made from the ``zhie`` command's own parsers.

    python docs/cli_reference.py            # print every table, each under its marker
    python docs/cli_reference.py --write    # rewrite every marked table of the page in place
    python docs/cli_reference.py --check    # exit 1, naming them, if a marked table differs from the parsers

A table stands between ``<!-- cli:NAME -->`` and ``<!-- /cli:NAME -->``, each on a line of its own; NAME is a key of
:data:`TABLES`. Edit the flags' help in the code, never the table: ``tests/test_docs.py`` fails when the two differ
(as ``tests/test_results.py`` does for the tables that ``benchmarks/report.py`` makes from result rows).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAGE = HERE / "training" / "configuration.md"
sys.path.insert(0, str(HERE.parent / "benchmarks"))  # the marked tables' rules, shared with benchmarks/report.py
import marked as marked_tables  # noqa: E402

TASKS = ["cws", "re", "similarity", "multitask", "xner-evaluator"]  # beside ner, whose table has the common flags


def parser_of(words: list[str]) -> argparse.ArgumentParser:
    """The parser of ``zhie WORDS...`` (``["train", "ner"]``: ``zhie train ner``'s)."""
    from zhie.cli import build_parser

    parser = build_parser(list(words))
    for word in words:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        if word not in sub.choices:
            raise ValueError(f"zhie {' '.join(words)}: the command has no {word!r} (it has {sorted(sub.choices)})")
        parser = sub.choices[word]
    return parser


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace("\n", " ")


def row(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    flag = " / ".join(action.option_strings)
    if action.nargs != 0:
        if action.choices is not None:
            flag += " {" + ",".join(map(str, action.choices)) + "}"
        else:
            metavar = action.metavar or action.dest.upper()
            flag += f" {metavar}" + (f" [{metavar} ...]" if action.nargs in ("+", "*") else "")
    help = parser._get_formatter()._expand_help(action) if action.help else ""
    default = action.default
    if "default" not in help and action.nargs != 0 and default not in (None, False, argparse.SUPPRESS, [], ()):
        help += f" (default: {default})"
    return f"| `{cell(flag)}` | {cell(help)} |"


def groups(parser: argparse.ArgumentParser) -> list[tuple[str, list[str]]]:
    """(title, rows) of each group of ``parser`` with options, ``--help`` left out."""
    out = []
    for group in parser._action_groups:
        rows = [row(parser, a) for a in group._group_actions if a.option_strings and a.dest != "help"
                and a.help != argparse.SUPPRESS]
        if rows:
            out.append((group.title, rows))
    return out


def table(rows: list[str]) -> str:
    return "| flag | what it does |\n|---|---|\n" + "\n".join(rows)


def render_groups(parser: argparse.ArgumentParser, leave_out: set[str] = frozenset()) -> str:
    parts = []
    for title, rows in groups(parser):
        rows = [r for r in rows if r not in leave_out]
        if rows:
            parts.append(f"*{title}*\n\n{table(rows)}")
    return "\n\n".join(parts)


def common_rows() -> set[str]:
    return {r for _, rows in groups(parser_of(["train", "ner"])) for r in rows}


def train_task(task: str) -> str:
    """``zhie train TASK``'s flags that ``zhie train ner``'s table does not already give as they are."""
    return render_groups(parser_of(["train", task]), common_rows())


TABLES = {
    "train-ner": lambda: render_groups(parser_of(["train", "ner"])),
    **{f"train-{task}": (lambda task=task: train_task(task)) for task in TASKS},
    "distill-student": lambda: render_groups(parser_of(["distill", "student"])),
    "distill-mtmt": lambda: render_groups(parser_of(["distill", "mtmt"])),
    "pretrain": lambda: render_groups(parser_of(["pretrain"])),
    "export": lambda: render_groups(parser_of(["export"])),
    "serve": lambda: render_groups(parser_of(["serve"])),
    "eval": lambda: render_groups(parser_of(["eval"])),
    "predict": lambda: render_groups(parser_of(["predict"])),
    "select": lambda: render_groups(parser_of(["select"])),
}


def stale(doc: str) -> list[str]:
    """The names of the marked tables of ``doc`` that differ from what the parsers make."""
    return marked_tables.stale(doc, "cli", TABLES)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = p.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help="rewrite the marked tables of the page in place")
    what.add_argument("--check", action="store_true", help="exit 1 if a marked table differs from the parsers")
    args = p.parse_args(argv)
    if not (args.write or args.check):
        for name, make in TABLES.items():
            print(f"<!-- cli:{name} -->\n{make()}\n<!-- /cli:{name} -->\n")
        return 0
    return marked_tables.update(PAGE, "cli", TABLES, args.check, "python docs/cli_reference.py --write")


if __name__ == "__main__":
    sys.exit(main())
