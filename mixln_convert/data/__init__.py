"""Text for calibration and evaluation: a download-free embedded corpus, user files, token blocks."""

from .corpus import SPLITS, embedded_corpus, read_texts, token_blocks

__all__ = ["SPLITS", "embedded_corpus", "read_texts", "token_blocks"]
