#!/usr/bin/env python3
"""Run the mixln-convert CLI from a source checkout, without installing the package."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mixln_convert.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
