"""The one data path: documents (the embedded corpus or user files) -> a token stream (a cached
array for small text, a tokenized folder of shards for training) -> fixed-length windows -> a
seeded sampler; calibration, evaluation, heal and training all use it."""

from .corpus import SPLITS, embedded_corpus, read_texts
from .shards import TokenShards
from .stream import (PackedWindows, Splits, data_fingerprint, load_splits, open_tokens, token_stream, token_windows,
                     windows)
from .tokenization import tokenize

__all__ = ["SPLITS", "PackedWindows", "Splits", "TokenShards", "data_fingerprint", "embedded_corpus", "load_splits",
           "open_tokens", "read_texts", "token_stream", "token_windows", "tokenize", "windows"]
