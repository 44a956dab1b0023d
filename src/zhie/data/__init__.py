"""Data readers: one per file format, each yielding typed examples with exclusive-end offsets.

Bad input raises :class:`DataError`, whose message is ``"path:line: reason"``.
"""

from zhie.data.base import DataError
from zhie.data.example import NerExample
from zhie.data.ner import (
    FORMATS,
    detect_format,
    read_cluener,
    read_cmeee,
    read_conll,
    read_ner,
    read_ner_jsonl,
    write_ner_jsonl,
)

__all__ = [
    "FORMATS",
    "DataError",
    "NerExample",
    "detect_format",
    "read_cluener",
    "read_cmeee",
    "read_conll",
    "read_ner",
    "read_ner_jsonl",
    "write_ner_jsonl",
]
