"""Side-by-side report of analyses and training runs (``mixln-convert compare``)."""

from .compare import compare

__all__ = ["compare"]
