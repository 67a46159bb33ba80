"""Checkpoint input/output, kept apart from the logic that decides what to write.

``loader`` reads tensors lazily, one at a time, from safetensors / .bin shards (or a whole
dequantized GGUF); ``writer`` writes safetensors shards and an index into a temporary folder
that is renamed into place only when everything succeeded.
"""
