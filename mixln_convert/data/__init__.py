"""The one data path of calibration, evaluation, heal and training (:mod:`.stream`)."""

from .corpus import SPLITS, embedded_corpus, read_texts
from .shards import TokenShards
from .stream import (PackedWindows, Splits, data_fingerprint, load_splits, open_tokens, token_stream, token_windows,
                     windows)
from .tokenization import tokenize

__all__ = ["SPLITS", "PackedWindows", "Splits", "TokenShards", "data_fingerprint", "embedded_corpus", "load_splits",
           "open_tokens", "read_texts", "token_stream", "token_windows", "tokenize", "windows"]
