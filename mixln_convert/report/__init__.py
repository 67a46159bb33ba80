"""The reports: analyses and training runs side by side (``mixln-convert compare``), the study's and the
sweep's. They read results; the commands that make them import them, never the other way round."""

from .compare import compare

__all__ = ["compare"]
