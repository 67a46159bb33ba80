"""The offline lm-evaluation-harness tasks that ship with mixln-convert (built by scripts/build_tasks.py;
docs/downstream.md says what each measures). This folder is an lm-eval ``--include_path``: its YAML
files name the tasks, ``langref.py`` loads their JSONL from beside it, wherever the package is installed."""

from importlib.resources import files
from pathlib import Path

SHIPPED_TASKS = ("mixln_langref_ppl", "mixln_langref_next")


def shipped_tasks_dir() -> Path:
    """The installed folder of the shipped task files (a real folder: the package is never zipped)."""
    return Path(str(files(__name__)))
