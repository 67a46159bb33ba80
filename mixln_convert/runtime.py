"""Process-wide tuning the heavy entry points (convert, heal, train, analyze, eval, prune) and the CLI apply."""

import ctypes
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD_BYTES = 1 << 20


def map_large_allocations() -> bool:
    """Have glibc map every allocation of 1 MiB or more on its own, and unmap it when freed.

    glibc raises its mmap threshold each time a mapped block is freed, up to 32 MiB; from then on tensors
    of that size come from the heap, where freed ones stay in the resident set until the heap's top is
    free, and a heal or training step's transient tensors pile up there. A fixed threshold turns that
    dynamic rise off. A user's own ``MALLOC_MMAP_THRESHOLD_`` wins; other C libraries (no ``mallopt``)
    are left alone. Setting it again is harmless. True when the threshold was set."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
