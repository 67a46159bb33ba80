"""The folders of the commands that orchestrate many runs (sweep, study): what --resume continues.

Such a command writes ``run.json`` (its kind and the settings its results depend on, the
source's identity among them) into its folder before any result; --resume then continues only a
run of the same kind begun with equal settings. A folder of the user's that merely exists, or
another source's results under a new name, is refused instead of written into or reused.
"""

import json
from pathlib import Path

from ..errors import MixLNError
from .atomic import write_atomic
from .paths import check_destination

RECORD = "run.json"


def claim_run(out, kind: str, settings: dict, inputs: dict, resume: bool, force: bool = False,
              force_hint: bool = True) -> Path:
    """``out`` resolved, once it may hold this run: absent or empty; with ``force`` anything but
    an input (the caller empties it); with ``resume`` a ``kind`` run whose record holds
    ``settings`` ({flag: JSON value}). ``inputs`` ({what: path}) are never written. Reads only."""
    target = check_destination(out, inputs, force=True, flag="--out")
    if force or not (target.is_dir() and any(target.iterdir())):
        return target
    if not resume:
        raise MixLNError(f"--out {out}: exists and is not empty; --resume continues the {kind} it holds"
                         + (", --force starts afresh" if force_hint else ""))
    record = target / RECORD
    try:
        started = json.loads(record.read_text())
        kind_there, settings_there = started["kind"], started["settings"]
        if not isinstance(settings_there, dict):
            raise TypeError
    except FileNotFoundError:
        raise MixLNError(f"--out {out}: holds no {kind} (no {RECORD}); --resume continues only a {kind} begun "
                         "there: choose another --out") from None
    except (OSError, ValueError, KeyError, TypeError):
        raise MixLNError(f"{record}: damaged; it holds the settings --resume must match") from None
    if kind_there != kind:
        raise MixLNError(f"--out {out}: holds a {kind_there}, not a {kind}; choose another --out")
    now = json.loads(json.dumps(settings))  # as the record reads back (tuples become lists)
    for key in [*now, *(key for key in settings_there if key not in now)]:
        if now.get(key) != settings_there.get(key):
            raise MixLNError(f"--resume: the {kind} in {out} started with {key} {_shown(settings_there.get(key))}, "
                             f"not {_shown(now.get(key))}; give the same, or another --out")
    return target


def record_run(out: Path, kind: str, settings: dict) -> None:
    """Write the record :func:`claim_run` compares a --resume with; ``out`` exists."""
    if not (out / RECORD).is_file():
        write_atomic(out / RECORD, json.dumps({"kind": kind, "settings": settings}, indent=1) + "\n")


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."
