"""Where a command may write: its inputs are never written, whatever the spelling of the paths.

Paths are compared resolved (``..``, symlinks, relative spellings). An output may not be an input, lie
inside one or contain one. A Hub model name enters as its snapshot folder in the Hugging Face cache.
No torch or transformers here: every command runs these checks before any weights are read.
"""

import glob
import os
from pathlib import Path

from ..errors import MixLNError
from ..options import FORCE
from .hub import HubDataset, hub_name, model_snapshot


def is_pattern(text) -> bool:
    return any(c in str(text) for c in "*?[")


def is_regular(path) -> bool:
    """A file or folder, not a FIFO or device: opening one can block for ever, waiting for a writer."""
    return os.path.isfile(path) or os.path.isdir(path)


def resolved(path) -> Path:
    """``path`` made absolute with ``..`` and every symlink resolved (the part that exists)."""
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def _named(path) -> list[str]:
    """The path an argument names, or each match of its glob pattern."""
    text = os.path.expanduser(str(path))
    if os.path.exists(text) or not is_pattern(text):
        return [text]
    return sorted(glob.glob(text, recursive=True))


def input_paths(path) -> list[Path]:
    """The files and folders an input argument names (a path, or a glob's matches), and what every symlink
    inside a named folder points to (a Hugging Face cache snapshot holds only links into its blobs)."""
    named = _named(path)
    found = [resolved(p) for p in named]
    for folder in (p for p in named if os.path.isdir(p)):
        for root, dirs, files in os.walk(folder):  # links are listed, not followed
            found += [resolved(os.path.join(root, name)) for name in dirs + files
                      if os.path.islink(os.path.join(root, name))]
    return found


def check_not_input(dst, inputs: dict, flag: str = "DST") -> Path:
    """Refuse ``dst`` when it is, contains or lies inside one of ``inputs`` ({what: path or None};
    a glob counts by its matches); returns ``dst`` resolved."""
    target = resolved(dst)
    for what, value in inputs.items():
        if value is None:
            continue
        for path in input_paths(value):
            if target == path or target.is_relative_to(path) or path.is_relative_to(target):
                how = "is" if target == path else "contains" if path.is_relative_to(target) else "lies inside"
                raise MixLNError(f"{flag} {dst}: {how} the input {what} {path}; an input is never written "
                                 f"({FORCE} does not change this)")
    return target


def check_destination(dst, inputs: dict, force: bool = False, flag: str = "DST") -> Path:
    """:func:`check_not_input`, and refuse a ``dst`` that is no folder, is a non-empty one without ``force``,
    or cannot be created."""
    target = check_not_input(dst, inputs, flag)
    if target.exists() and not target.is_dir():
        raise MixLNError(f"{flag} {dst}: exists and is not a folder")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise MixLNError(f"{flag} {dst}: exists and is not empty (use {FORCE} to replace it)")
    parent = next((p for p in target.parents if p.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise MixLNError(f"{flag} {dst}: cannot create it ({parent} is not a writable folder)")
    return target


def check_readable(path, flag: str) -> None:
    """A data argument that must exist now: a path (a glob must match), or a Hub dataset name that
    ``datasets`` can load (:mod:`.hub`); None (not given) passes."""
    dataset = hub_name(path, "dataset")
    if dataset is not None:
        HubDataset(dataset).builder(flag)
    elif path is not None:
        _check_paths(path, flag)


def checkpoint_path(path, flag: str):
    """A checkpoint argument as a local path: a path that exists, or a Hub model name's snapshot folder
    (:mod:`.hub`). A checkpoint already open passes through."""
    if not isinstance(path, (str, os.PathLike)):
        return path
    model = hub_name(path, "model")
    if model is not None:
        return model_snapshot(model, flag)
    _check_paths(path, flag)
    return os.path.expanduser(path) if isinstance(path, str) else Path(os.path.expanduser(path))  # as checked


def _check_paths(path, flag: str) -> None:
    """The path, or each match of its glob pattern, exists and is a regular file or folder."""
    named = _named(path)
    if not named or not all(os.path.exists(p) for p in named):
        raise MixLNError(f"{flag} {path}: no such file or folder" if not is_pattern(path)
                         else f"{flag} {path}: glob pattern matches no files")
    for p in named:
        if not is_regular(p):
            raise MixLNError(f"{flag} {p}: not a regular file or folder")
