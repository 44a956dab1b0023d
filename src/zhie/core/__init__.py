"""The lowest layer: what every other layer uses, in plain Python and numpy, without torch.

Spans and tagging schemes (:mod:`~zhie.core.spans`), text offsets, windows and the reporting rule
(:mod:`~zhie.core.text`), word-level tagging on sub-words (:mod:`~zhie.core.words`), metrics, atomic files, the numpy
decoders that the torch model and an export share (:mod:`~zhie.core.decoding`) and model cards
(:mod:`~zhie.core.card`). Nothing here imports torch, nor any other part of zhie but this package and
:mod:`zhie.version`.
"""
