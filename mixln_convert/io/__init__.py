"""Checkpoint input/output, kept apart from the logic that decides what to write: lazy readers (``loader``,
``gguf``), the atomic safetensors writer (``writer``) and the files of run folders (``runs``)."""
