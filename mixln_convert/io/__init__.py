"""Checkpoint input/output, kept apart from the logic that decides what to write.

``loader`` reads tensors lazily, one at a time, from safetensors / .bin shards (``gguf``: from a
GGUF file, dequantized); ``writer`` writes safetensors shards and an index into a temporary folder
that is renamed into place only when everything succeeded; ``runs`` reads and writes what the
commands leave in their run folders (summaries, metrics, analyses, results).
"""
