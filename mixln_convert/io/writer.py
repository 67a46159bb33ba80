"""Atomic output folders and a sharded safetensors writer.

A conversion writes into a hidden temporary folder beside the destination and renames it
into place at the very end, so a conversion that fails or is killed leaves no half-written
checkpoint behind (at worst a ``.DST.tmp-*`` folder, removed on failure).
"""

import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..errors import MixLNError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str | int) -> int:
    """'5GB' -> 5e9, '500MiB' -> 500 * 2**20, 1000 -> 1000 (transformers' conventions)."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(str(text))
    if not match:
        raise MixLNError(f"--max-shard-size: cannot read size {text!r} (examples: 5GB, 500MB, 2GiB)")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()])


@contextmanager
def atomic_output_dir(dst, force: bool = False, protect=()):
    """Yield a temporary folder that becomes ``dst`` when the block succeeds.

    Refuses a non-empty ``dst`` unless ``force``, and any ``dst`` that is or contains one of
    the ``protect`` paths (the source checkpoint must never be touched).
    """
    dst = Path(dst).absolute()
    for p in protect:
        p = Path(p).absolute()
        if dst == p or p.is_relative_to(dst) or (p.is_dir() and dst.is_relative_to(p)):
            raise MixLNError(f"{dst}: the output must not be, contain or lie inside the source {p}")
    if dst.exists() and not dst.is_dir():
        raise MixLNError(f"{dst}: exists and is not a folder")
    if dst.is_dir() and any(dst.iterdir()) and not force:
        raise MixLNError(f"{dst}: exists and is not empty (use --force to replace it)")
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    except OSError as e:
        raise MixLNError(f"{dst}: cannot write the output folder ({e.strerror})") from None
    try:
        yield tmp
        if dst.exists():
            old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
            dst.rename(old)
            tmp.rename(dst)
            shutil.rmtree(old)
        else:
            tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class ShardedWriter:
    """Collect tensors and write them as ``model-XXXXX-of-YYYYY.safetensors`` shards.

    A shard is flushed as soon as the next tensor would exceed ``max_shard_bytes``, so memory
    holds at most one shard. The index (``model.safetensors.index.json``) is written last, by
    :meth:`close`; a checkpoint that fits one shard is saved as ``model.safetensors``, like
    transformers does.
    """

    def __init__(self, folder: Path, max_shard_bytes: int, metadata: dict | None = None):
        self.folder = Path(folder)
        self.max_shard_bytes = max_shard_bytes
        self.metadata = {"format": "pt", **(metadata or {})}
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.shards: list[list[str]] = []  # tensor names of each flushed shard, in order
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.max_shard_bytes:
            self._flush()
        self.pending[name] = tensor.contiguous()
        self.pending_bytes += size
        self.total_bytes += size

    def _flush(self) -> None:
        save_file(self.pending, str(self._temp_name(len(self.shards))), metadata=self.metadata)
        self.shards.append(list(self.pending))
        self.pending, self.pending_bytes = {}, 0

    def _temp_name(self, k: int) -> Path:
        return self.folder / f"shard-{k:05d}.partial"

    def close(self) -> list[str]:
        """Flush, give shards their final names, write the index; return the shard file names."""
        if self.pending or not self.shards:
            self._flush()
        n = len(self.shards)
        names = ["model.safetensors"] if n == 1 else [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
        for k, name in enumerate(names):
            self._temp_name(k).rename(self.folder / name)
        if n > 1:
            index = {
                "metadata": {"total_size": self.total_bytes},
                "weight_map": {t: names[k] for k, shard in enumerate(self.shards) for t in shard},
            }
            (self.folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        return names
