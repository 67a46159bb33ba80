"""Model surgery above io/: prefix and shared-tail models built from checkpoints, pruning, loading helpers."""
