"""The one data path: documents (the embedded corpus or user files) -> a token stream (a cached
array for small text, a tokenized folder of shards for training) -> fixed-length blocks -> a
seeded sampler; calibration, evaluation, heal and training all use it."""

from .corpus import SPLITS, embedded_corpus, read_texts
from .shards import TokenShards
from .stream import (PackedBlocks, Splits, blocks, data_fingerprint, load_splits, open_tokens, token_blocks,
                     token_stream)
from .tokenization import tokenize

__all__ = ["SPLITS", "PackedBlocks", "Splits", "TokenShards", "blocks", "data_fingerprint", "embedded_corpus",
           "load_splits", "open_tokens", "read_texts", "token_blocks", "token_stream", "tokenize"]
