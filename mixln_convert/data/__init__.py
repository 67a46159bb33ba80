"""The one data path of calibration, evaluation, heal and training (:mod:`.stream`)."""

__all__ = ["SPLITS", "PackedWindows", "Splits", "TokenShards", "data_fingerprint", "embedded_corpus", "load_splits",
           "open_tokens", "read_texts", "token_stream", "token_windows", "tokenize", "windows"]


def __getattr__(name: str):  # imported when first used: .options (the CLI's) imports no numpy
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import corpus, shards, stream, tokenization

    return next(getattr(module, name) for module in (corpus, shards, stream, tokenization) if hasattr(module, name))
