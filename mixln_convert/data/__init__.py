"""The one data path: documents (the embedded corpus or user files) -> a cached token stream ->
fixed-length blocks -> a seeded sampler; calibration, evaluation, heal and training all use it."""

from .corpus import SPLITS, embedded_corpus, read_texts
from .stream import PackedBlocks, Splits, blocks, load_splits, split_texts, token_blocks, token_stream

__all__ = ["SPLITS", "PackedBlocks", "Splits", "blocks", "embedded_corpus", "load_splits", "read_texts",
           "split_texts", "token_blocks", "token_stream"]
