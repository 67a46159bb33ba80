"""The one data path of calibration, evaluation, heal and training (:mod:`.stream`)."""

import importlib

# each name's module, imported when the name is first used: .options (the CLI's) imports no numpy
_MODULES = {"SPLITS": "corpus", "embedded_corpus": "corpus", "read_texts": "corpus", "TokenShards": "shards",
            "tokenize": "tokenization", **dict.fromkeys(("PackedWindows", "Splits", "data_fingerprint", "load_splits",
                                                         "open_tokens", "token_stream", "token_windows", "windows"),
                                                        "stream")}
__all__ = sorted(_MODULES)


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULES[name]}", __name__), name)
