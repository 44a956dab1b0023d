"""Sentence pairs for similarity (Chinese STS-B, ATEC, LCQMC, …): ``s1 \\t s2 \\t label`` per line.

Labels are numbers: binary (0/1) or graded (e.g. STS-B's 0–5). Blank lines are skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zhie.data.base import DataError, PathLike, iter_lines, shown


@dataclass(frozen=True)
class Pair:
    text_a: str
    text_b: str
    label: float


def read_pairs(path: PathLike) -> list[Pair]:
    pairs = []
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise DataError(path, lineno, f"expected 3 tab-separated fields (s1, s2, label), got {len(fields)}")
        try:
            label = float(fields[2])
        except ValueError:
            raise DataError(path, lineno, f"label {shown(fields[2])} is not a number") from None
        if not math.isfinite(label):
            raise DataError(path, lineno, f"label {shown(fields[2])} is not a finite number; give a score such as 0, 1 "
                            "or 3.8")
        if not fields[0].strip() or not fields[1].strip():
            raise DataError(path, lineno, "empty sentence")
        pairs.append(Pair(fields[0], fields[1], label))
    if not pairs:
        raise DataError(path, 1, "empty file: no sentence pair")
    return pairs
