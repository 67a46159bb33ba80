"""`python benchmarks/same_outputs.py --base REV`, the command docs/development.md gives: the
maintenance suite's same-outputs case (`python -m benchmarks maintenance same-outputs --help`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.maintenance import same_outputs  # noqa: E402

same_outputs(sys.argv[1:])
