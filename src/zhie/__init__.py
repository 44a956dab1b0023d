"""zhie: Chinese information extraction in PyTorch.

``zhie.load(DIR)`` returns the pipeline of a trained model directory, e.g. ``zhie.load(DIR).predict(texts)``.
"""

__version__ = "0.1.0"


def load(path, device=None):
    """Load a model directory written by ``zhie train`` (see :func:`zhie.pipeline.load`)."""
    from zhie.pipeline import load as _load

    return _load(path, device)
