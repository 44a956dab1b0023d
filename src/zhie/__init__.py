"""zhie: Chinese information extraction in PyTorch."""

__version__ = "0.1.0"
