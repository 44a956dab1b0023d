"""zhie: Chinese information extraction in PyTorch.

``zhie.load(DIR)`` returns the pipeline of a trained model directory (``zhie.load(DIR).predict(texts)``);
``zhie.fit(TASK, train, dev, out=DIR, ...)`` trains one.
"""

from zhie.version import __version__

__all__ = ["__version__", "fit", "load"]


def load(path, device=None, precision="fp32", threads=None):
    """Load a model directory written by ``zhie train`` (see :func:`zhie.deploy.pipeline.load`)."""
    from zhie.deploy.pipeline import load as _load

    return _load(path, device, precision, threads)


def fit(task, train_path=None, dev_path=None, **kwargs):
    """Train a model of a registered task (see :func:`zhie.training.fit.fit`)."""
    from zhie.training.fit import fit as _fit

    return _fit(task, train_path, dev_path, **kwargs)
