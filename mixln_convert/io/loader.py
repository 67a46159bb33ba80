"""An HF checkpoint folder (safetensors or .bin, sharded or not) or a GGUF file, opened and validated
once per process (:func:`open_checkpoint`). Shards are memory-mapped and read per tensor (.bin ones with
``torch.load(mmap=True, weights_only=True)``, never plain unpickling); headers are checked first.
"""

import fnmatch
import json
import math
import os
import pickle
import re
import shutil
from functools import lru_cache
from pathlib import Path

import torch

from ..architectures import architecture_of_any
from ..errors import MixLNError, first_line
from .checkpoint import Checkpoint, StoredTensor
from .checkpoint_files import EXTRA_FILE_PATTERNS, WEIGHT_FILES
from .gguf import GGUFCheckpoint
from .records import read_json
from .validate import check_config, check_config_loads, check_finite, check_tensors


# safetensors' dtype names -> bytes per element, of the dtypes a model checkpoint may hold
_FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
_MAX_HEADER = 100 * 2**20  # safetensors' own limit on a header's size


class FolderCheckpoint(Checkpoint):
    """An HF checkpoint folder; ``get(name)`` reads one tensor from the shard that holds it."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.config = read_json(self.path / "config.json")
        check_config(self.config, self.where)
        self.arch = architecture_of_any(self.config, self.where)
        self._open_name, self._open_shard = None, None
        self._headers = {}  # safetensors shard -> {tensor name: header entry with the file offset}
        self.shard_of = self._index()  # tensor name -> shard file
        check_tensors({name: self.shape(name) for name in self.shard_of}, self.config, self.arch, str(self.path))
        head, embed = self.arch.lm_head, self.arch.embed
        # a tied config over a head of its own: transformers 5 uses that head where it differs from the
        # embeddings, 4.x the embeddings; refused unless they are equal (a tied head saved anyway)
        tied_apart = self.config.get("tie_word_embeddings") and head in self.shard_of
        if tied_apart and not torch.equal(self.get(head), self.get(embed)):
            raise MixLNError(f"{self.path / self.shard_of[head]}: tensor {head} differs from {embed}, but "
                             f"{self.where} declares tie_word_embeddings true; set it to false to use the head, "
                             f"or remove {head} to tie")

    def check_loadable(self) -> None:
        if not self.__dict__.get("_loadable"):
            check_config_loads(self.config, self.where)
            self._loadable = True

    def _index(self) -> dict[str, str]:
        for index_name, single in WEIGHT_FILES:
            if (self.path / index_name).is_file():
                return self._read_index(self.path / index_name)
            if (self.path / single).is_file():
                return {name: single for name in self._shard_names(single)}
        raise MixLNError(f"{self.path}: no model.safetensors, pytorch_model.bin or index found")

    def _read_index(self, file: Path) -> dict[str, str]:
        index = read_json(file)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise MixLNError(f"{file}: weight_map must be a non-empty mapping of tensor names to shard files")
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or Path(shard).name != shard or shard in (".", ".."):
                raise MixLNError(f"{file}: tensor {name} maps to {shard!r}, not a shard file name in this folder")
        for shard in sorted(set(weight_map.values())):
            if not (self.path / shard).is_file():
                raise MixLNError(f"{self.path / shard}: shard named in the index is missing")
            held = set(self._shard_names(shard))
            absent = [name for name, s in weight_map.items() if s == shard and name not in held]
            if absent:
                raise MixLNError(f"{self.path / shard}: lacks tensor {absent[0]}, which {file.name} places there")
        return dict(weight_map)

    def _shard_names(self, shard: str) -> list[str]:
        return list(self._header(shard) if shard.endswith(".safetensors") else self._open(shard).keys())

    def _open(self, shard: str):
        """The open handle of ``shard`` (for names and shapes, and .bin tensors); one at a time."""
        if self._open_name != shard:
            self._open_name, self._open_shard = shard, self._load(shard)
        return self._open_shard

    def _load(self, shard: str):
        from safetensors import safe_open

        file = self.path / shard
        try:
            if shard.endswith(".safetensors"):
                return safe_open(str(file), framework="pt", device="cpu")
            state = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
        except pickle.UnpicklingError as e:  # weights_only met something other than tensors
            code = re.search(r"GLOBAL (\S+)", str(e))
            what = f"calls {code.group(1)}" if code else "holds objects other than tensors"
            raise MixLNError(f"{file}: refused to load: its pickle {what} (only tensors are read from "
                             ".bin files, with torch.load(weights_only=True))") from None
        except Exception as e:  # safetensors and torch raise several types for a bad file
            raise MixLNError(f"{file}: corrupt or unreadable checkpoint shard ({type(e).__name__}: {e})") from None
        if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
            raise MixLNError(f"{file}: not a state dict of tensors")
        return state

    def _header(self, shard: str) -> dict[str, dict]:
        """A safetensors shard's header, checked against the file (a truncated shard is refused before any work)."""
        if shard in self._headers:
            return self._headers[shard]
        file = self.path / shard
        bad = f"{file}: corrupt safetensors shard"
        try:
            size = file.stat().st_size
            with open(file, "rb") as f:
                length = int.from_bytes(f.read(8), "little")
                if size < 8 or length > min(size - 8, _MAX_HEADER):
                    raise MixLNError(f"{bad} (header length {length} for a file of {size} bytes)")
                header = json.loads(f.read(length))
        except OSError as e:
            raise MixLNError(f"{file}: cannot read ({e.strerror})") from None
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise MixLNError(f"{bad} (its header is not JSON)") from None
        if not isinstance(header, dict):
            raise MixLNError(f"{bad} (its header is not a JSON object)")
        entries, end = {}, 0
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (first, last) = entry["dtype"], [int(d) for d in entry["shape"]], entry["data_offsets"]
            except (TypeError, KeyError, ValueError):
                raise MixLNError(f"{bad} (tensor {name}: malformed header entry)") from None
            if dtype not in _FLOAT_DTYPES:
                raise MixLNError(f"{file}: tensor {name} has dtype {dtype}; a model's weights are floating point")
            if not (isinstance(first, int) and isinstance(last, int) and 0 <= first <= last
                    and last - first == math.prod(shape) * _FLOAT_DTYPES[dtype]):
                raise MixLNError(f"{bad} (tensor {name}: offsets {[first, last]} do not fit shape {shape} {dtype})")
            entries[name] = {"shape": tuple(shape), "offset": 8 + length + first}
            end = max(end, last)
        if 8 + length + end > size:
            raise MixLNError(f"{file}: truncated ({size} bytes, its header needs {8 + length + end})")
        self._headers[shard] = entries
        return entries

    def names(self) -> list[str]:
        return list(self.shard_of)

    def get(self, name: str) -> torch.Tensor:
        return self.stored(name).tensor

    def stored(self, name: str) -> StoredTensor:
        """One tensor, its values checked; from safetensors, a view of the memory-mapped shard (no
        copy), with where its bytes lie there."""
        try:
            shard = self.shard_of[name]
        except KeyError:
            raise MixLNError(f"{self.path}: tensor {name} not found in the checkpoint") from None
        if shard.endswith(".safetensors"):
            # A memory map of its own per tensor, released with the tensor: pages read through a
            # shared map would count in this process's memory until the whole shard is done.
            with self._load(shard) as handle:
                stored = StoredTensor(handle.get_tensor(name), self.path / shard, self._header(shard)[name]["offset"])
        else:
            stored = StoredTensor(self._open(shard)[name])
        check_finite(name, stored.tensor, str(self.path / shard))
        return stored

    def shape(self, name: str) -> tuple[int, ...]:
        shard = self.shard_of[name]
        if shard.endswith(".safetensors"):
            return self._header(shard)[name]["shape"]
        return tuple(self._open(shard)[name].shape)

    def dtype(self) -> torch.dtype:
        return self.get(self.names()[0]).dtype

    def largest_shard_bytes(self) -> int:
        """Size of the largest shard file: what a streaming conversion may hold in memory at once."""
        return max((self.path / s).stat().st_size for s in set(self.shard_of.values()))

    def copy_extras(self, dst: Path) -> None:
        for file in sorted(self.path.iterdir()):
            if file.is_file() and any(fnmatch.fnmatch(file.name, p) for p in EXTRA_FILE_PATTERNS):
                shutil.copy2(file, dst / file.name)
        written = dst / "config.json"
        model_type = read_json(written).get("model_type") if written.is_file() else None
        if model_type != self.config.get("model_type"):  # the same files under another model type
            self.pin_tokenizer_class(dst)

    def _load_model(self, dtype):
        from transformers import AutoModelForCausalLM

        try:
            return AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype or "auto")
        except (OSError, ValueError, KeyError) as e:
            raise MixLNError(f"{self.path}: cannot load the model ({first_line(e)})") from None


def open_checkpoint(path) -> Checkpoint:
    """The checkpoint at ``path``, validated; opened once per process while its files are unchanged."""
    if isinstance(path, Checkpoint):
        return path
    path = Path(path)
    if not path.exists():
        raise MixLNError(f"{path}: no such checkpoint")
    if path.is_file() and path.suffix == ".gguf":
        marker = path
    elif path.is_dir():
        marker = path / "config.json"
        if not marker.is_file():
            raise MixLNError(f"{path}: no config.json; expected a checkpoint folder or a .gguf file")
    else:
        raise MixLNError(f"{path}: expected a checkpoint folder or a .gguf file")
    stat, gguf = marker.stat(), marker is path
    # a GGUF keeps its own name: the Hugging Face cache links snapshots/REV/NAME.gguf to a blob without a suffix
    where = os.path.abspath(path) if gguf else os.path.realpath(path)
    return _open(where, gguf, stat.st_mtime_ns, stat.st_size, stat.st_ino)


@lru_cache(maxsize=8)
def _open(path: str, gguf: bool, mtime_ns: int, size: int, inode: int) -> Checkpoint:
    return GGUFCheckpoint(Path(path)) if gguf else FolderCheckpoint(Path(path))
